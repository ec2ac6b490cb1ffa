"""Loading weights: float weights quantized on load, transformers' packed ternary weights with their
scales, safetensors files (bfloat16, round trips) and malformed files named precisely."""

import json
import struct

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference
from bitnet_gpu.checkpoint import load_safetensors, save_safetensors
from bitnet_gpu.models import (
    BitNetConfig,
    BitNetModel,
    PROJECTIONS,
    unpack_hf_ternary,
    weight_names,
)
from conftest import check_logits
from hf_checkpoint import pack_hf

rng = np.random.default_rng()


def _tiny(**changes):
    return BitNetConfig.preset("tiny", **changes)


def _float_weights(config, seed=0):
    r = np.random.default_rng(seed)
    return {
        name: (
            r.standard_normal(shape).astype(np.float32) * (0.02 if len(shape) == 2 else 1)
            + (1 if len(shape) == 1 else 0)
        ).astype(np.float32)
        for name, shape in weight_names(config).items()
    }


def test_float_weights_are_quantized_on_load():
    config = _tiny()
    weights = _float_weights(config)
    model = BitNetModel.from_weights(weights, config, embedding_dtype=np.float32)
    params = model.reference_params()
    for module, short in PROJECTIONS:
        w = weights[f"model.layers.1.{module}.weight"]
        values, gamma = reference.quantize_ternary(w)
        np.testing.assert_array_equal(params["layers"][1]["proj"][short][0], values)
        np.testing.assert_allclose(params["layers"][1]["proj"][short][1], gamma, rtol=1e-6)
    ids = np.random.default_rng(5).integers(0, config.vocab_size, (1, 11))
    ref, ties = reference.bitnet_forward(params, config, ids, True)
    check_logits(model.forward(ids), ref, ties)


def test_hf_packed_weights_load_with_their_scales(tmp_path):
    config = _tiny()
    weights = _float_weights(config)
    packed = {}
    expect = {}
    for name, w in weights.items():
        module = name[: -len(".weight")]
        if w.ndim == 2 and "embed" not in name and "lm_head" not in name:
            values = rng.integers(-1, 2, w.shape).astype(np.int8)
            packed[name] = pack_hf(values)
            packed[module + ".weight_scale"] = np.array([rng.uniform(2, 50)], np.float32)
            expect[module] = values
        else:
            packed[name] = w
    np.testing.assert_array_equal(
        unpack_hf_ternary(packed["model.layers.0.mlp.up_proj.weight"], config.intermediate_size),
        expect["model.layers.0.mlp.up_proj"],
    )
    model = BitNetModel.from_weights(packed, config)
    params = model.reference_params()
    for module, short in PROJECTIONS:
        values, gamma = params["layers"][0]["proj"][short]
        np.testing.assert_array_equal(values, expect[f"model.layers.0.{module}"])
        scale = packed[f"model.layers.0.{module}.weight_scale"][0]
        np.testing.assert_allclose(gamma, 1 / scale, rtol=1e-6)
    # The same weights from a safetensors file (with config.json beside it) give the same logits.
    save_safetensors(tmp_path / "model.safetensors", packed)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(
            {
                "hidden_size": config.hidden_size,
                "intermediate_size": config.intermediate_size,
                "num_hidden_layers": config.num_hidden_layers,
                "vocab_size": config.vocab_size,
                "num_attention_heads": config.num_attention_heads,
                "rope_theta": config.rope_theta,
                "num_key_value_heads": config.num_key_value_heads,
                "model_type": "bitnet",
                "max_position_embeddings": config.max_position_embeddings,
                "tie_word_embeddings": True,
            },
            f,
        )
    from_file = BitNetModel.from_weights(tmp_path)
    ids = rng.integers(0, config.vocab_size, (1, 5))
    np.testing.assert_array_equal(from_file.forward(ids), model.forward(ids))


def test_missing_and_misshapen_tensors_are_named():
    config = _tiny()
    weights = _float_weights(config)
    del weights["model.layers.1.mlp.down_proj.weight"]
    weights["model.layers.0.self_attn.k_proj.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(bg.ShapeError) as info:
        BitNetModel.from_weights(weights, config)
    assert "missing model.layers.1.mlp.down_proj.weight" in str(info.value)
    assert "model.layers.0.self_attn.k_proj.weight: expected shape (32, 64), got (3, 3)" in str(
        info.value
    )
    weights = _float_weights(config)
    weights["model.layers.0.mlp.up_proj.weight"] = np.zeros(
        (config.intermediate_size // 4, config.hidden_size), np.uint8
    )
    with pytest.raises(bg.ShapeError, match="weight_scale"):
        BitNetModel.from_weights(weights, config)
    weights = _float_weights(config)  # complex values are not cut to their real part
    weights["model.norm.weight"] = weights["model.norm.weight"].astype(np.complex64)
    weights["model.layers.0.mlp.gate_proj.weight"] = weights[
        "model.layers.0.mlp.gate_proj.weight"
    ].astype(np.complex64)
    with pytest.raises(bg.ShapeError) as info:
        BitNetModel.from_weights(weights, config)
    assert "model.norm.weight: expected real numbers, got dtype complex64" in str(info.value)
    assert "model.layers.0.mlp.gate_proj.weight: expected real numbers" in str(info.value)


def test_safetensors_round_trip_and_bfloat16(tmp_path):
    arrays = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": np.arange(7, dtype=np.int8),
        "c": np.zeros((0, 2), np.float16),
        "d": rng.integers(0, 255, (4,)).astype(np.uint8),
    }
    save_safetensors(tmp_path / "x.safetensors", arrays, {"format": "np"})
    back = load_safetensors(tmp_path / "x.safetensors")
    assert set(back) == set(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype
        np.testing.assert_array_equal(back[name], a)
    values = rng.standard_normal(6).astype(np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bfloat16
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}).encode()
    with open(tmp_path / "bf.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bf16.tobytes())
    w = load_safetensors(tmp_path / "bf.safetensors")["w"]
    np.testing.assert_array_equal(w, (bf16.astype(np.uint32) << 16).view(np.float32).reshape(2, 3))
    with open(tmp_path / "bad.safetensors", "wb") as f:
        f.write(b"\x05\x00")
    with pytest.raises(bg.ArgumentError, match="not a safetensors file"):
        load_safetensors(tmp_path / "bad.safetensors")


@pytest.mark.parametrize(
    "header,message",
    [
        ([1, 2], "header is not a JSON object"),
        ({"w": 5}, "not an object"),
        ({"w": {"shape": [1], "data_offsets": [0, 4]}}, "no dtype name"),
        ({"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, "no dtype name"),
        ({"w": {"dtype": "F32", "shape": ["a"], "data_offsets": [0, 4]}}, "shape that is not"),
        ({"w": {"dtype": "F32", "shape": [-1, -1], "data_offsets": [0, 4]}}, "shape that is not"),
        (
            {"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}},
            "shape that is not",
        ),  # not cut to 1
        ({"w": {"dtype": "F32", "shape": 3, "data_offsets": [0, 4]}}, "shape that is not"),
        (
            {"w": {"dtype": "F32", "shape": [1], "data_offsets": [-8, -4]}},
            "data_offsets",
        ),  # not the header's bytes
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, "data_offsets"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, "past the end"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, "4 bytes for F32"),
        ({"w": {"dtype": "BF16", "shape": [-2], "data_offsets": [0, 4]}}, "shape that is not"),
        (None, "header of 1000 bytes in a file of"),
    ],
)
def test_malformed_safetensors_files_name_what_is_wrong(tmp_path, header, message):
    """A file that does not follow the format raises ArgumentError naming the file and what is
    wrong with it, never an AttributeError or a silent misreading."""
    file = tmp_path / "bad.safetensors"
    with open(file, "wb") as f:
        if header is None:  # a header length past the end of the file
            f.write(struct.pack("<Q", 1000) + b"{}")
        else:
            text = json.dumps(header).encode()
            f.write(struct.pack("<Q", len(text)) + text + b"\0" * 4)
    with pytest.raises(bg.ArgumentError, match=message) as error:
        load_safetensors(file)
    assert str(file) in str(error.value)


def _config_json(config, **extra):
    """A transformers 4 style config.json dict for `config` (theta at the top level)."""
    values = {
        "model_type": "bitnet",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "hidden_act": "relu2",
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
    }
    values.update(extra)
    return {k: v for k, v in values.items() if v is not None}


def test_rope_theta_is_read_where_either_transformers_version_writes_it():
    config = _tiny(rope_theta=10000.0)
    v4 = BitNetConfig.from_dict(_config_json(config))
    v5 = BitNetConfig.from_dict(
        _config_json(
            config, rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
        )
    )
    assert v4 == v5 == config
    assert v4.rope_theta == 10000.0 != BitNetConfig().rope_theta  # not the 2B4T default
    weights = _float_weights(config)
    ids = rng.integers(0, config.vocab_size, (1, 6))
    logits = {
        theta: BitNetModel.from_weights(weights, _tiny(rope_theta=theta)).forward(ids)
        for theta in (10000.0, 500000.0)
    }
    assert not np.allclose(logits[10000.0], logits[500000.0])  # the theta matters to the logits


def test_tied_embeddings_default_to_transformers_default():
    config = _tiny()
    assert (
        BitNetConfig.from_dict(_config_json(config, tie_word_embeddings=None)).tie_word_embeddings
        is False
    )
    assert BitNetConfig.from_dict(_config_json(config)).tie_word_embeddings is True
    weights = _float_weights(config)
    with pytest.raises(bg.ShapeError, match="lm_head.weight"):  # untied, and no head given
        BitNetModel.from_weights(
            weights, BitNetConfig.from_dict(_config_json(config, tie_word_embeddings=None))
        )


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"hidden_act": "silu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"head_dim": 32}, "head_dim"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"rope_scaling": "linear"}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0}}, "rope_parameters"),
        ({"rope_parameters": 10000.0}, "rope_parameters"),
        (
            {"quantization_config": {"quant_method": "bitnet", "linear_class": "ternarylinear"}},
            "quantization_config",
        ),
        (
            {"quantization_config": {"quant_method": "bitnet", "quantization_mode": "later"}},
            "quantization_config",
        ),
        (
            {"quantization_config": {"quant_method": "bitnet", "use_rms_norm": True}},
            "quantization_config",
        ),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
    ],
)
def test_a_key_the_project_cannot_run_is_refused_by_name(extra, key):
    with pytest.raises(bg.UnsupportedError, match=f"config.json: {key} = "):
        BitNetConfig.from_dict(_config_json(_tiny(), **extra))


def test_keys_that_change_nothing_here_are_taken():
    config = _tiny()
    taken = BitNetConfig.from_dict(
        _config_json(
            config,
            head_dim=config.hidden_size // config.num_attention_heads,
            rope_scaling=None,
            attention_bias=False,
            attention_dropout=0.1,
            initializer_range=0.02,
            use_cache=True,
            quantization_config={
                "quant_method": "bitnet",
                "linear_class": "bitlinear",
                "quantization_mode": "offline",
            },
        )
    )
    assert taken == config
    with pytest.raises(bg.ArgumentError, match="expected a dict"):
        BitNetConfig.from_dict([("hidden_size", 64)])


def test_config_beside_a_single_file_and_sharded_checkpoints(tmp_path):
    config = _tiny()
    weights = _float_weights(config)
    ids = rng.integers(0, config.vocab_size, (1, 5))
    expected = BitNetModel.from_weights(weights, config).forward(ids)
    single = tmp_path / "single"
    single.mkdir()
    save_safetensors(single / "model.safetensors", weights)
    with open(single / "config.json", "w") as f:
        json.dump(_config_json(config), f)
    np.testing.assert_array_equal(
        BitNetModel.from_weights(single / "model.safetensors").forward(ids), expected
    )
    # Shards as transformers writes them: two files and an index mapping each tensor to its file.
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    names = sorted(weights)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, part in halves.items():
        save_safetensors(sharded / file, {n: weights[n] for n in part})
    index = {"metadata": {}, "weight_map": {n: file for file, part in halves.items() for n in part}}
    with open(sharded / "model.safetensors.index.json", "w") as f:
        json.dump(index, f)
    with open(sharded / "config.json", "w") as f:
        json.dump(_config_json(config), f)
    (sharded / "stray.safetensors").write_bytes(b"not read: the index names the shards")
    np.testing.assert_array_equal(BitNetModel.from_weights(sharded).forward(ids), expected)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(bg.ArgumentError, match="model-00002-of-00002.safetensors"):
        BitNetModel.from_weights(sharded)
    (sharded / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(bg.ArgumentError, match="not a safetensors index"):
        load_safetensors(sharded)


def test_the_embedding_keeps_the_checkpoints_precision(rng):
    """float16 for the embedding and head only where that loses nothing or by request: a float32
    table stays float32 (its logits the reference's, to NUMERICS.md's bounds around near ties),
    one whose values float16 holds exactly (as the 2B4T checkpoint's bfloat16 ones) and a float16
    one take float16."""
    config = _tiny(tie_word_embeddings=False)
    weights = _float_weights(config)
    weights["lm_head.weight"] = rng.standard_normal((config.vocab_size, config.hidden_size)).astype(
        np.float32
    )
    ids = rng.integers(0, config.vocab_size, (1, 7))
    full = BitNetModel.from_weights(weights, config)
    assert full.embedding_dtype == np.float32 and np.dtype(full.embed.dtype) == np.float32
    np.testing.assert_array_equal(full.embed.numpy(), weights["model.embed_tokens.weight"])
    expected, ties = reference.bitnet_forward(full.reference_params(), config, ids, True)
    check_logits(full.forward(ids), expected, ties)
    exact = dict(weights)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        exact[name] = weights[name].astype(np.float16).astype(np.float32)  # float16 holds these
    assert BitNetModel.from_weights(exact, config).embedding_dtype == np.float16
    halves = dict(exact, **{"lm_head.weight": exact["lm_head.weight"].astype(np.float16)})
    assert BitNetModel.from_weights(halves, config).embedding_dtype == np.float16
    asked = BitNetModel.from_weights(weights, config, embedding_dtype=np.float16)
    assert asked.embedding_dtype == np.float16 and np.dtype(asked.embed.dtype) == np.float16
    with pytest.raises(bg.DTypeError, match="embedding_dtype"):
        BitNetModel.from_weights(weights, config, embedding_dtype=np.float64)


def test_autobitlinear_weights_mean_what_transformers_computes():
    """AutoBitLinear: offline, ternary values (packed, int8 or float) times weight_scale;
    online, float weights quantized on load (absmean), any weight_scale ignored; offline float
    weights that are not ternary are refused (transformers would run them unquantized)."""
    weights = _float_weights(_tiny())
    ternary = dict(weights)
    for key, w in weights.items():
        if w.ndim == 2 and "embed" not in key and "lm_head" not in key:
            ternary[key] = rng.integers(-1, 2, w.shape).astype(np.int8)
            ternary[key.replace(".weight", ".weight_scale")] = np.float32([2.0])
    name = "model.layers.0.mlp.down_proj"
    values = ternary[name + ".weight"]
    offline = _tiny(linear_class="autobitlinear")
    for form in (pack_hf(values), values, values.astype(np.float32)):
        given = {**ternary, name + ".weight": form, name + ".weight_scale": np.float32([0.25])}
        model = BitNetModel.from_weights(given, offline)
        got, gamma = model.reference_params()["layers"][0]["proj"]["down"]
        np.testing.assert_array_equal(got, values)
        assert gamma == np.float32(0.25)  # bitlinear would take 1 / 0.25
    bitlinear = BitNetModel.from_weights({**given, name + ".weight": values}, _tiny())
    assert bitlinear.reference_params()["layers"][0]["proj"]["down"][1] == np.float32(4)
    with pytest.raises(bg.UnsupportedError, match="AutoBitLinear's offline weights"):
        BitNetModel.from_weights(weights, offline)
    online = BitNetModel.from_weights(
        {**weights, name + ".weight_scale": np.float32([7])},
        _tiny(linear_class="autobitlinear", quantization_mode="online"),
    )
    expected = reference.quantize_ternary(weights[name + ".weight"])
    got, gamma = online.reference_params()["layers"][0]["proj"]["down"]
    np.testing.assert_array_equal(got, expected[0])
    np.testing.assert_allclose(gamma, expected[1], rtol=1e-6)

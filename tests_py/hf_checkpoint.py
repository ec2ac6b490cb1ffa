"""A small checkpoint directory in the Hugging Face layout and dtype mix of
microsoft/bitnet-b1.58-2B-4T, for the tests that read one (test_text, test_transformers):
config.json (transformers 4 or 5 layout), model.safetensors (packed uint8 projections with
bfloat16 weight_scale, bfloat16 embedding and norms; or float weights for AutoBitLinear online),
a byte-level BPE tokenizer.json trained here by `tokenizers`, tokenizer_config.json with a
Llama-3-style chat template, generation_config.json with two end ids."""

import json

import numpy as np

from bitnet_gpu.checkpoint import save_safetensors
from bitnet_gpu.models import BitNetConfig, weight_names

SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. Ternary weights take three values.",
    "BitNet b1.58 runs on any Vulkan GPU, with int8 activations and exact accumulators.",
    "Grüße aus Köln — naïve café, 東京の天気は晴れ, emoji 🙂 and ✓ marks.",
] * 20


def build_tokenizer(path):
    """A byte-level BPE tokenizer of 360 ids trained on CORPUS, adding <|begin_of_text|>."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    tok.save(str(path))
    return tok


def pack_hf(values):
    """transformers' packing of int8 ternary [rows, K] into uint8 [rows / 4, K] (rows % 4 == 0):
    packed row r holds rows r, r + rows / 4, ... in bits 0-1, 2-3, ..., each value plus one."""
    quarter = values.shape[0] // 4
    packed = np.zeros((quarter, values.shape[1]), np.uint8)
    for i in range(4):
        packed |= (values[i * quarter : (i + 1) * quarter] + 1).astype(np.uint8) << (2 * i)
    return packed


def config_json(config: BitNetConfig, layout=5, **changes) -> dict:
    """config.json as transformers `layout` (4 or 5) writes it: RoPE's theta top-level and
    torch_dtype (4), or in rope_parameters and dtype (5)."""
    values = {
        "architectures": ["BitNetForCausalLM"],
        "model_type": "bitnet",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": "relu2",
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": 0,
        "eos_token_id": 4,
        "quantization_config": {
            "quant_method": "bitnet",
            "linear_class": config.linear_class,
            "quantization_mode": config.quantization_mode,
        },
    }
    if layout == 4:
        values.update(rope_theta=config.rope_theta, torch_dtype="bfloat16")
    else:
        values.update(
            rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
            dtype="bfloat16",
        )
    values.update(changes)
    return values


def checkpoint_weights(config: BitNetConfig, seed=7):
    """(arrays, names to write as bfloat16): the 2B4T mix. Projections: packed ternary values
    with a weight_scale (BitLinear: W = V / scale, about 1 / mean|W|; AutoBitLinear offline: W =
    V * scale), or float weights (AutoBitLinear online). Embedding, head and norms: bfloat16."""
    rng = np.random.default_rng(seed)
    arrays, bf16 = {}, set()
    online = config.quantization_mode == "online" and config.linear_class == "autobitlinear"
    for name, shape in weight_names(config).items():
        module = name[: -len(".weight")]
        if len(shape) == 1:
            arrays[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            bf16.add(name)
        elif "embed" in name or "lm_head" in name:
            # logits of a few units either way, tied or not, as a trained model's
            scale = 0.15 if "embed" in name else 1 / np.sqrt(shape[1])
            arrays[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
            bf16.add(name)
        elif online:
            arrays[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
            bf16.add(name)
        else:
            values = rng.choice(np.array([-1, 0, 1], np.int8), shape, p=[0.3, 0.4, 0.3])
            arrays[name] = pack_hf(values)
            # a bfloat16 scale: exactly what both readers see
            gain = (
                np.sqrt(shape[1]) if config.linear_class == "bitlinear" else 1 / np.sqrt(shape[1])
            )
            arrays[module + ".weight_scale"] = np.array([gain * rng.uniform(0.8, 1.25)], np.float32)
            bf16.add(module + ".weight_scale")
    return arrays, bf16


def write_checkpoint(folder, config: BitNetConfig, layout=5, seed=7, tokenizer=True, **changes):
    """Writes the directory; returns the tokenizer (or None)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder / "tokenizer.json") if tokenizer else None
    arrays, bf16 = checkpoint_weights(config, seed)
    save_safetensors(folder / "model.safetensors", arrays, {"format": "pt"}, bfloat16=bf16)
    (folder / "config.json").write_text(json.dumps(config_json(config, layout, **changes)))
    if tok is not None:
        (folder / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "bos_token": "<|begin_of_text|>",
                    "eos_token": {"content": "<|eot_id|>"},
                    "chat_template": CHAT_TEMPLATE,
                }
            )
        )
        ends = [tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|end_of_text|>")]
        (folder / "generation_config.json").write_text(
            json.dumps({"eos_token_id": ends, "do_sample": False})
        )
    return tok

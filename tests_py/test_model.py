"""The BitNet b1.58 decoder end to end: logits and generation against bitnet_gpu.reference, chunked
decoding, sampling, the command line."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference
from bitnet_gpu.models import BitNetConfig, BitNetModel, Pick
from conftest import TIE_WINDOW, check_logits, rel

rng = np.random.default_rng()


def _tiny(**changes):
    return BitNetConfig.preset("tiny", **changes)


@pytest.fixture(scope="module")
def tiny_model():
    return BitNetModel.random(_tiny(tie_word_embeddings=False), seed=3, embedding_dtype=np.float32)


@pytest.mark.parametrize("batch,tokens,seed", [(1, 1, 0), (1, 7, 1), (2, 33, 2), (3, 5, 3)])
def test_forward_matches_reference(tiny_model, batch, tokens, seed):
    ids = np.random.default_rng(seed).integers(0, tiny_model.config.vocab_size, (batch, tokens))
    logits = tiny_model.forward(ids)
    ref, ties = reference.bitnet_forward(
        tiny_model.reference_params(), tiny_model.config, ids, True
    )
    assert logits.shape == (batch, tokens, tiny_model.config.vocab_size)
    check_logits(logits, ref, ties)
    one = tiny_model.forward(ids[0])  # 1-D in, 2-D out
    np.testing.assert_array_equal(one, tiny_model.forward(ids[:1])[0])


def test_forward_on_fresh_prompts_matches_reference(tiny_model):
    params = tiny_model.reference_params()
    strict = 0
    for _ in range(4):
        ids = rng.integers(0, tiny_model.config.vocab_size, (4, int(rng.integers(1, 12))))
        ref, ties = reference.bitnet_forward(params, tiny_model.config, ids, True)
        strict += check_logits(tiny_model.forward(ids), ref, ties)
    assert strict >= 2  # the strict bound was really exercised


def test_forward_with_tied_float16_embedding():
    model = BitNetModel.random(_tiny(), seed=5)  # tied, float16 table
    ids = np.random.default_rng(4).integers(0, model.config.vocab_size, (2, 9))
    ref, ties = reference.bitnet_forward(model.reference_params(), model.config, ids, True)
    check_logits(model.forward(ids), ref, ties)
    assert model.lm_head is model.embed


@pytest.mark.skipif("not bg.default_device().info.features.get('cooperative_matrix_khr_float16')")
def test_float16_prefill_attention_stays_near_float32():
    """prefill_attention="float16" (GPU only): a 40-token prefill's logits within 2e-2 of the
    float32 model's (the attention outputs move by about 1e-3 of |v|; the int8 quantization of
    the next projections' inputs can turn that into a few codes), decode steps unchanged."""
    config = _tiny(hidden_size=128, tie_word_embeddings=False)  # head dim 32
    plain = BitNetModel.random(config, seed=7, embedding_dtype=np.float32)
    half = BitNetModel.random(
        config, seed=7, embedding_dtype=np.float32, prefill_attention="float16"
    )
    ids = np.random.default_rng(8).integers(0, config.vocab_size, (2, 40))
    assert half.prefill_attention == "float16"
    assert rel(half.forward(ids), plain.forward(ids)) <= 2e-2
    half.prefill_attention = "float32"
    np.testing.assert_array_equal(half.forward(ids), plain.forward(ids))


def test_prefill_attention_is_checked():
    features = bg.default_device().info.features
    match = (
        "head dim 16" if features.get("cooperative_matrix_khr_float16") else "float16 cooperative"
    )
    with pytest.raises(bg.UnsupportedError, match=match):
        BitNetModel(_tiny(), prefill_attention="float16")
    with pytest.raises(bg.ArgumentError, match="precision"):
        BitNetModel(_tiny(), prefill_attention="half")


@pytest.mark.parametrize("seed", [10, 11])
def test_greedy_generation_matches_reference_for_32_steps(tiny_model, seed):
    prompt = np.random.default_rng(seed).integers(0, tiny_model.config.vocab_size, (2, 6))
    out = tiny_model.generate(prompt, 32)
    ref = reference.bitnet_generate(tiny_model.reference_params(), tiny_model.config, prompt, 32)
    np.testing.assert_array_equal(out, ref)
    assert len(np.unique(out[:, 6:])) > 4  # the test generates varied tokens


@pytest.mark.parametrize("seed,batch", [(12, 1), (13, 1), (14, 3), (15, 11)])
def test_screened_greedy_generation_is_the_float_heads(tiny_model, seed, batch):
    """Greedy, one sequence or a batch (11: more rows than one pass of the screening takes): the
    decode graphs pick the next ids through the screened head; the ids are the reference's and
    those of the float head's argmax, for 32 steps."""
    prompt = np.random.default_rng(seed).integers(0, tiny_model.config.vocab_size, (batch, 5))
    assert tiny_model.screened_head
    tiny_model.reset_graphs()
    out = tiny_model.generate(prompt, 32)
    assert any(
        plan.pick is Pick.ARGMAX and plan.tokens == 1 and plan.screened and plan.batch == batch
        for plan in tiny_model.recorded_plans()
    )
    assert tiny_model.screening_nbytes == tiny_model.config.vocab_size * (
        tiny_model.config.hidden_size + 16
    )
    ref = reference.bitnet_generate(tiny_model.reference_params(), tiny_model.config, prompt, 32)
    np.testing.assert_array_equal(out, ref)
    tiny_model.screened_head = False
    try:
        tiny_model.reset_graphs()
        np.testing.assert_array_equal(tiny_model.generate(prompt, 32), out)
    finally:
        tiny_model.screened_head = True
        tiny_model.reset_graphs()


def test_screened_head_is_built_once_and_only_when_on():
    model = BitNetModel.random(_tiny(), seed=6)
    assert model.screened_head and model.screening_nbytes == 0  # built at the first greedy step
    model.prepare_screened_head()
    first = model.screening.tables(model.lm_head)
    assert model.screening_nbytes > 0
    model.generate(np.arange(3), 2)
    assert model.screening.tables(model.lm_head) is first
    off = BitNetModel.random(_tiny(), seed=6, screened_head=False)
    off.prepare_screened_head()
    np.testing.assert_array_equal(off.generate(np.arange(3), 4), model.generate(np.arange(3), 4))
    assert off.screening_nbytes == 0
    odd = _tiny(hidden_size=70, num_attention_heads=5, num_key_value_heads=1)  # K % 4 != 0
    with pytest.raises(bg.ArgumentError, match="screened_head: hidden size 70"):
        BitNetModel(odd, screened_head=True)
    fallback = BitNetModel.random(odd, seed=1)
    assert not fallback.screened_head
    prompt = np.arange(3)
    np.testing.assert_array_equal(
        fallback.generate(prompt, 3),
        reference.bitnet_generate(fallback.reference_params(), odd, prompt[None], 3)[0],
    )


def test_greedy_generation_across_the_decode_split_switch(tiny_model, monkeypatch):
    """Decode graphs of one sequence take 16 keys a workgroup up to the policy's short_context
    tokens, 32 up to long_context and 64 beyond: a generation that crosses both switches (set at 9
    and 17 tokens here) still gives the reference's ids, and records decode graphs of each kind
    (chunks of steps that stop at each switch); two sequences take the batch split throughout,
    and so does one where split_by_context is off."""
    monkeypatch.setattr(
        tiny_model,
        "policy",
        dataclasses.replace(tiny_model.policy, short_context=9, long_context=17),
    )
    tiny_model.reset_graphs()
    prompt = np.random.default_rng(11).integers(0, tiny_model.config.vocab_size, (1, 6))
    out = tiny_model.generate(prompt, 24)
    ref = reference.bitnet_generate(tiny_model.reference_params(), tiny_model.config, prompt, 24)
    np.testing.assert_array_equal(out, ref)
    assert sorted({p.split_keys for p in tiny_model.recorded_plans() if p.tokens == 1}) == [
        16,
        32,
        64,
    ]
    tiny_model.reset_graphs()
    pair = np.concatenate([prompt, prompt[:, ::-1]])
    np.testing.assert_array_equal(
        tiny_model.generate(pair, 24),
        reference.bitnet_generate(tiny_model.reference_params(), tiny_model.config, pair, 24),
    )
    assert {p.split_keys for p in tiny_model.recorded_plans() if p.tokens == 1} == {
        tiny_model.policy.batch_split
    }
    tiny_model.reset_graphs()
    monkeypatch.setattr(
        tiny_model, "policy", dataclasses.replace(tiny_model.policy, split_by_context=False)
    )
    np.testing.assert_array_equal(tiny_model.generate(prompt, 24), out)
    assert {p.split_keys for p in tiny_model.recorded_plans() if p.tokens == 1} == {
        tiny_model.policy.batch_split
    }
    tiny_model.reset_graphs()


def test_decode_steps_equal_a_full_forward(tiny_model):
    ids = rng.integers(0, tiny_model.config.vocab_size, 20)
    full = tiny_model.forward(ids)
    session = tiny_model.session()
    steps = [session.step(ids[position : position + 1]) for position in range(20)]
    # Decode attends with the split-key kernel, a prefill with the other: float32 sums in another
    # order, so an int8 near a rounding tie may differ between the two (as against the reference).
    _, ties = reference.bitnet_forward(
        tiny_model.reference_params(), tiny_model.config, ids[None], True
    )
    assert rel(np.array(steps), full) <= (1e-5 if ties.min() > TIE_WINDOW else 5e-2)


def test_prefill_graphs_do_not_accumulate(tiny_model):
    device = tiny_model.device
    tiny_model.reset_graphs()  # the shared model's other sessions keep prefill graphs of their own
    for tokens in range(2, 9):
        tiny_model.forward(np.arange(tokens))
    kept = [plan for plan in tiny_model.recorded_plans() if plan.prefill]
    assert len(kept) <= tiny_model.policy.kept_prefill_graphs
    before = device.memory_stats()["in_use_bytes"]
    for tokens in range(2, 9):
        tiny_model.forward(np.arange(tokens))
    assert device.memory_stats()["in_use_bytes"] <= before  # replaced, not piled up


@pytest.mark.parametrize(
    "seed,top_k,top_p", [(14, 40, None), (15, None, None), (18, None, 0.8), (19, 40, 0.95)]
)
def test_sampled_generation_is_the_references_draws(tiny_model, seed, top_k, top_p):
    """temperature 0.9: decode replays of decode_chunk steps draw on the GPU, bit for bit, the
    tokens one step a replay draws, and each token is reference.sample_rows's draw from the
    reference's logits with its position as the step (a sequence may part from the reference at a
    near tie of two kept scores, or with top_p where the nucleus rule comes within 1e-3 of keeping
    a value more or fewer, which the GPU's logits, within 1e-4 of the reference's, can decide
    either way; the check allows that and stops following that sequence)."""
    if top_p is not None and not tiny_model.device.info.features["int64_atomics"]:
        pytest.skip("top-p needs 64-bit integer atomics")
    config = tiny_model.config
    prompt = np.random.default_rng(seed).integers(0, config.vocab_size, (2, 5))
    out = tiny_model.generate(prompt, 24, temperature=0.9, top_k=top_k, seed=seed, top_p=top_p)
    pick = Pick.SAMPLE if top_p is None else Pick.NUCLEUS if top_k is None else Pick.NUCLEUS_TOP_K
    plans = tiny_model.recorded_plans()
    assert any(p.pick is pick and p.chain == tiny_model.decode_chunk for p in plans)
    tiny_model.decode_chunk = 1
    try:
        np.testing.assert_array_equal(
            tiny_model.generate(prompt, 24, temperature=0.9, top_k=top_k, seed=seed, top_p=top_p),
            out,
        )
    finally:
        tiny_model.decode_chunk = 8
    params, following, matched = tiny_model.reference_params(), [True, True], 0
    for position in range(5, 29):
        logits = reference.bitnet_forward(params, config, out[:, :position])[:, -1]
        want = reference.sample_rows(logits, 0.9, top_k, seed, position, top_p)
        for b in range(2):
            if not following[b]:
                continue
            got = out[b, position]
            if got == want[b]:
                matched += 1
                continue
            scores = reference.sampling_scores(logits[b], 0.9, seed, position, b)
            near_score = scores[want[b]] - scores[got] <= 1e-3 * (1 + np.abs(logits[b]).max())
            near_nucleus = reference.nucleus_threshold(logits[b], top_k, top_p, 0.9)[1] < 1e-3
            assert near_score or near_nucleus, (b, position)
            following[b] = False
    assert matched >= 40
    assert len(np.unique(out[:, 5:])) > 8


@pytest.mark.parametrize(
    "batch,top_k,top_p", [(3, None, None), (11, 40, None), (4, 40, 0.9), (4, None, 0.9)]
)
def test_screened_sampled_batches_are_the_float_heads(tiny_model, batch, top_k, top_p):
    """A batch's draws go through the screened head (but for top-p without top-k), each row with
    its own noise: the ids the float head's draws give, bit for bit, in chunks of steps."""
    if top_p is not None and not tiny_model.device.info.features["int64_atomics"]:
        pytest.skip("top-p needs 64-bit integer atomics")
    prompt = np.random.default_rng(batch).integers(0, tiny_model.config.vocab_size, (batch, 5))
    sampling = dict(temperature=1.3, top_k=top_k, seed=batch, top_p=top_p)
    tiny_model.reset_graphs()
    out = tiny_model.generate(prompt, 20, **sampling)
    screens = top_p is None or top_k is not None
    assert any(
        p.pick.draws and p.batch == batch and p.screened == screens
        for p in tiny_model.recorded_plans()
    )
    tiny_model.screened_head = False
    try:
        tiny_model.reset_graphs()
        np.testing.assert_array_equal(tiny_model.generate(prompt, 20, **sampling), out)
    finally:
        tiny_model.screened_head = True
        tiny_model.reset_graphs()
    assert len(np.unique(out[:, 5:])) > 8


@pytest.mark.parametrize("top_k", [None, 40])
def test_top_p_generation_of_one_sequence(tiny_model, top_k):
    """One sequence with top_p: with top_k through the screened head ('nucleus_top_k' graphs,
    screened), without it through the float16 head ('nucleus'); in chunks, and the float head's
    ids one step a replay bit for bit; top_p 1 is the draw without it; a tiny top_p keeps the
    largest logit alone, so it is greedy."""
    if not tiny_model.device.info.features["int64_atomics"]:
        pytest.skip("top-p needs 64-bit integer atomics")
    prompt = np.random.default_rng(20).integers(0, tiny_model.config.vocab_size, 5)
    tiny_model.reset_graphs()
    out = tiny_model.generate(prompt, 24, temperature=1.1, top_k=top_k, seed=3, top_p=0.9)
    if top_k is None:
        assert any(p.pick is Pick.NUCLEUS and not p.screened for p in tiny_model.recorded_plans())
    else:
        # through the screened head
        assert any(p.pick is Pick.NUCLEUS_TOP_K and p.screened for p in tiny_model.recorded_plans())
    tiny_model.decode_chunk = 1
    tiny_model.screened_head = False
    try:
        tiny_model.reset_graphs()
        np.testing.assert_array_equal(
            tiny_model.generate(prompt, 24, temperature=1.1, top_k=top_k, seed=3, top_p=0.9), out
        )
        assert not any(p.screened for p in tiny_model.recorded_plans())
    finally:
        tiny_model.decode_chunk = 8
        tiny_model.screened_head = True
        tiny_model.reset_graphs()
    assert len(np.unique(out[5:])) > 6
    np.testing.assert_array_equal(
        tiny_model.generate(prompt, 12, temperature=1.1, top_k=top_k, seed=3, top_p=1.0),
        tiny_model.generate(prompt, 12, temperature=1.1, top_k=top_k, seed=3),
    )
    np.testing.assert_array_equal(
        tiny_model.generate(prompt, 12, temperature=1.1, top_k=top_k, seed=3, top_p=1e-9),
        tiny_model.generate(prompt, 12),
    )


def test_sampling_is_seeded_and_top_k_one_is_greedy(tiny_model):
    prompt = rng.integers(0, tiny_model.config.vocab_size, 4)
    a = tiny_model.generate(prompt, 10, temperature=0.8, top_k=20, seed=7)
    b = tiny_model.generate(prompt, 10, temperature=0.8, top_k=20, seed=7)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        tiny_model.generate(prompt, 10, temperature=1.0, top_k=1), tiny_model.generate(prompt, 10)
    )
    steps = []
    tiny_model.generate(prompt, 5, callback=lambda i, ids: steps.append((i, ids.copy())))
    assert [i for i, _ in steps] == list(range(5))
    eos = int(tiny_model.generate(prompt, 1)[-1])
    assert len(tiny_model.generate(prompt, 10, eos_token_id=eos)) == len(prompt) + 1


def test_model_input_errors(tiny_model):
    v = tiny_model.config.vocab_size
    # A few ids are checked with Python's min and max, more with NumPy's: both bounds, both ways.
    for bad in ([0, v], [-1, 0], [0] * 100 + [v], [-1] + [0] * 100):
        with pytest.raises(bg.ArgumentError, match="ids must lie"):
            tiny_model.forward(np.array(bad))
    with pytest.raises(bg.DTypeError):
        tiny_model.forward(np.array([0.5]))
    with pytest.raises(bg.ShapeError):
        tiny_model.forward(np.zeros((1, 0), np.int64))
    with pytest.raises(bg.ShapeError, match="max_tokens"):
        tiny_model.generate(np.zeros(250, np.int64), 10)
    with pytest.raises(bg.ArgumentError):
        tiny_model.generate(np.zeros(3, np.int64), 2, temperature=-1)
    with pytest.raises(bg.ArgumentError):
        tiny_model.generate(np.zeros(3, np.int64), 2, temperature=1, top_k=0)
    with pytest.raises(TypeError, match="top_k: expected an integer"):
        tiny_model.generate(np.zeros(3, np.int64), 2, temperature=1, top_k=2.5)
    for top_p in (0, 1.5, float("nan")):
        with pytest.raises(bg.ArgumentError, match="top_p"):
            tiny_model.generate(np.zeros(3, np.int64), 2, temperature=1, top_p=top_p)
    with pytest.raises(TypeError, match="max_new_tokens: expected an integer"):
        tiny_model.generate(np.zeros(3, np.int64), 2.5)
    with pytest.raises(bg.ArgumentError):
        BitNetConfig.preset("huge")
    with pytest.raises(bg.ArgumentError):
        BitNetConfig(hidden_size=30, num_attention_heads=4)
    for field, bad in [
        ("rms_norm_eps", -1e-5),
        ("rms_norm_eps", float("nan")),
        ("rope_theta", 0.0),
        ("rope_theta", float("inf")),
    ]:
        with pytest.raises(bg.ArgumentError, match=f"BitNetConfig.{field}"):
            BitNetConfig.preset("tiny", **{field: bad})
    with pytest.raises(TypeError, match="BitNetConfig.hidden_size: expected an integer"):
        BitNetConfig.preset("tiny", hidden_size=64.5)  # not cut to 64
    assert BitNetConfig.preset("tiny", hidden_size=np.int64(64)).head_dim == 16
    np.testing.assert_array_equal(
        tiny_model.forward(np.array([1, 2])).shape, (2, v)
    )  # still usable


def test_command_line_generates_with_random_weights():
    env = dict(os.environ)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bitnet_gpu",
            "generate",
            "--config",
            "tiny",
            "--random-weights",
            "--tokens",
            "8",
            "--prompt-tokens",
            "3",
            "--kv-cache-dtype",
            "float16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "tokens/s" in result.stdout
    if bg.default_device().info.features["int64_atomics"]:
        nucleus = subprocess.run(
            [
                sys.executable,
                "-m",
                "bitnet_gpu",
                "generate",
                "--config",
                "tiny",
                "--random-weights",
                "--tokens",
                "4",
                "--temperature",
                "0.8",
                "--top-p",
                "0.9",
                "--top-k",
                "40",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert nucleus.returncode == 0 and "tokens/s" in nucleus.stdout, nucleus.stderr
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "bitnet_gpu",
            "generate",
            "--weights",
            "/nonexistent.safetensors",
            "--config",
            "tiny",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert (
        missing.returncode == 2
        and "generate:" in missing.stderr
        and "Traceback" not in missing.stderr
    )
    # Bad settings end with a message and status 2, as bad arguments do, not a traceback.
    for extra, message in [
        (["--tokens", "-1"], "max_new_tokens"),
        (["--temperature", "-1"], "temperature"),
        (["--top-k", "0"], "top_k"),
        (["--top-p", "1.5"], "top_p"),
        (["--prompt-ids", "1,2,99999"], "ids must lie"),
        (["--prompt-ids", "abc"], "comma-separated token ids"),
        (["--prompt", "hello"], "no tokenizer"),
    ]:
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "bitnet_gpu",
                "generate",
                "--config",
                "tiny",
                "--random-weights",
                "--tokens",
                "2",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, (
            extra,
            bad.stderr,
        )


@pytest.mark.parametrize("batch,chunk", [(1, 8), (1, 3), (2, 8), (2, 5)])
def test_chunked_greedy_decode_is_bit_for_bit_one_step_a_replay(
    tiny_model, monkeypatch, batch, chunk
):
    """Greedy decode runs up to decode_chunk steps a graph replay, each step's ids feeding the next
    step's embedding on the GPU (through the screened head): the ids are those of one replay a
    token and the reference's, over 21 new tokens (chunks, then shorter ones), across a split
    switch (at 13 tokens here), and with an end-of-sequence id."""
    monkeypatch.setattr(
        tiny_model, "policy", dataclasses.replace(tiny_model.policy, short_context=13)
    )
    prompt = np.random.default_rng(20 + batch).integers(0, tiny_model.config.vocab_size, (batch, 4))
    runs = {}
    for decode_chunk in (1, chunk):
        monkeypatch.setattr(tiny_model, "decode_chunk", decode_chunk)
        tiny_model.reset_graphs()
        runs[decode_chunk] = tiny_model.generate(prompt, 21)
        steps = sorted({p.chain for p in tiny_model.recorded_plans() if p.tokens == 1})
        assert steps[-1] == decode_chunk and len(tiny_model.recorded_plans()) > 1
    np.testing.assert_array_equal(runs[chunk], runs[1])
    ref = reference.bitnet_generate(tiny_model.reference_params(), tiny_model.config, prompt, 21)
    np.testing.assert_array_equal(runs[chunk], ref)
    eos = int(runs[1][0, 4 + 6])  # the 7th new token of the first sequence, inside a chunk
    streamed = list(tiny_model.stream(prompt, 21, eos_token_id=eos))
    monkeypatch.setattr(tiny_model, "decode_chunk", 1)
    single = list(tiny_model.stream(prompt, 21, eos_token_id=eos))
    assert len(streamed) == len(single) <= 21
    for a, b in zip(streamed, single):
        np.testing.assert_array_equal(a, b)
    tiny_model.reset_graphs()


def test_decode_chunks_stop_at_split_switches_and_at_the_end():
    model = BitNetModel.random(_tiny(), seed=4, max_tokens=40)
    assert model.decode_chunk == 8
    model.policy = dataclasses.replace(model.policy, short_context=12, long_context=30)
    # (cached tokens, tokens still wanted) -> steps of the next replay: 8, or a power of two that
    # ends before a split switch (a step after `start` cached tokens has context start + 1).
    assert [
        model.policy.chain(s, r)
        for s, r in [
            (0, 20),
            (4, 20),
            (5, 20),
            (8, 20),
            (11, 20),
            (12, 20),
            (12, 3),
            (12, 1),
            (29, 20),
            (30, 20),
        ]
    ] == [8, 8, 4, 4, 1, 8, 2, 1, 1, 8]
    prompt = np.arange(5)
    out = model.generate(prompt, 40 - 5)  # up to max_tokens: the last chunks are short
    np.testing.assert_array_equal(
        out, reference.bitnet_generate(model.reference_params(), model.config, prompt[None], 35)[0]
    )
    for bad in (0, -2):
        with pytest.raises(bg.ArgumentError, match="decode_chunk"):
            BitNetModel(_tiny(), decode_chunk=bad)
    with pytest.raises(TypeError, match="decode_chunk"):
        BitNetModel(_tiny(), decode_chunk=2.5)

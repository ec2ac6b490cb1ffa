"""Speculative decoding (prompt lookup, or a caller's proposer): the same ids as plain decoding,
greedy and sampled, bit for bit, for every k and batch shape; rejected drafts leave nothing in the
session; fewer drafts where they keep failing; bad arguments raise ArgumentError."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu.models import BitNetConfig, BitNetModel
from bitnet_gpu.models.speculative import prompt_lookup

VOCAB = 384


@pytest.fixture(scope="module")
def model():
    config = BitNetConfig.preset("tiny", tie_word_embeddings=False)
    return BitNetModel.random(config, seed=3, embedding_dtype=np.float32, max_tokens=160)


def _repetitive(rng, length):
    """A prompt that repeats itself (prompt lookup finds drafts), with a random tail."""
    base = rng.integers(0, VOCAB, 7)
    return np.concatenate([np.tile(base, length // 7 + 1)[:length], rng.integers(0, VOCAB, 3)])


def _count_steps(model, monkeypatch):
    """A list the runner appends each replayed step's plan to."""
    plans, run = [], model.runner.run
    monkeypatch.setattr(
        model.runner,
        "run",
        lambda pool, step: plans.append(model.runner.plan(step)) or run(pool, step),
    )
    return plans


def test_prompt_lookup_is_transformers_rule():
    ids = np.array([5, 6, 7, 8, 5, 6, 9, 5, 6])
    np.testing.assert_array_equal(prompt_lookup(ids, 3, 2), [7, 8, 5])  # first match of (5, 6)
    np.testing.assert_array_equal(prompt_lookup(ids, 10, 2), [7, 8, 5, 6, 9, 5, 6])
    np.testing.assert_array_equal(prompt_lookup(np.array([1, 2, 3, 4]), 3, 2), [])  # no match
    np.testing.assert_array_equal(prompt_lookup(np.array([1, 2, 3, 2]), 2, 2), [3, 2])  # n = 1
    assert prompt_lookup(np.array([4]), 3).size == 0


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_ids_are_plain_decodings(model, k, seed):
    rng = np.random.default_rng(seed)
    for prompt in (_repetitive(rng, 20), rng.integers(0, VOCAB, 9)):
        plain = model.generate(prompt, 30)
        np.testing.assert_array_equal(model.generate(prompt, 30, prompt_lookup_num_tokens=k), plain)
        np.testing.assert_array_equal(
            model.generate(prompt, 30, prompt_lookup_num_tokens=k, max_matching_ngram_size=1),
            plain,
        )


@pytest.mark.parametrize("k", [2, 5])
def test_batches_each_with_their_own_drafts(model, k):
    """A ragged batch and a left-padded one: every sequence's ids are plain decoding's; sequences
    that run ahead wait (their rows change nothing) and the stream stays in step."""
    rng = np.random.default_rng(7)
    prompts = [_repetitive(rng, 14), rng.integers(0, VOCAB, 4), _repetitive(rng, 25)]
    for got, want in zip(
        model.generate(prompts, 24, prompt_lookup_num_tokens=k), model.generate(prompts, 24)
    ):
        np.testing.assert_array_equal(got, want)
    width = max(len(p) for p in prompts)
    ids = np.zeros((3, width), np.int64)
    mask = np.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :], mask[b, width - len(p) :] = p, 1
    np.testing.assert_array_equal(
        model.generate(ids, 20, attention_mask=mask, prompt_lookup_num_tokens=k),
        model.generate(ids, 20, attention_mask=mask),
    )


@pytest.mark.parametrize("top_k,top_p", [(None, None), (20, None), (None, 0.8), (30, 0.9)])
def test_sampled_ids_are_plain_samplings(model, top_k, top_p):
    if top_p is not None and not model.device.info.features["int64_atomics"]:
        pytest.skip("top-p needs 64-bit integer atomics")
    rng = np.random.default_rng(11)
    prompts = [_repetitive(rng, 16), _repetitive(rng, 9)]
    settings = dict(temperature=0.7, top_k=top_k, top_p=top_p, seed=5)
    plain = model.generate(prompts, 20, **settings)
    fast = model.generate(prompts, 20, prompt_lookup_num_tokens=4, **settings)
    for got, want in zip(fast, plain):
        np.testing.assert_array_equal(got, want)
    one = model.generate(prompts[0], 20, **settings)
    np.testing.assert_array_equal(
        model.generate(prompts[0], 20, prompt_lookup_num_tokens=3, **settings), one
    )


def test_drafts_always_right_take_few_steps(model, monkeypatch):
    """A proposer that drafts plain decoding's own continuation: every draft is accepted, the ids
    are plain decoding's, and 24 ids take a handful of verify steps."""
    prompt = np.random.default_rng(3).integers(0, VOCAB, 6)
    plain = model.generate(prompt, 24)
    own = plain[len(prompt) :]

    def oracle(ids, count):
        made = len(ids) - len(prompt)
        return own[made : made + count]

    plans = _count_steps(model, monkeypatch)
    np.testing.assert_array_equal(
        model.generate(prompt, 24, proposer=oracle, prompt_lookup_num_tokens=8), plain
    )
    verify = [p for p in plans if p.every_token]
    assert verify and len(plans) <= 6, [(p.tokens, p.every_token) for p in plans]


def test_drafts_never_right_fall_back_to_plain_steps(model, monkeypatch):
    """A proposer whose drafts are always wrong: the ids are still plain decoding's, and the
    drafter soon asks for none (plain chained steps), trying again now and then."""
    prompt = np.random.default_rng(4).integers(0, VOCAB, 6)
    plain = model.generate(prompt, 60)
    own = plain[len(prompt) :]

    def wrong(ids, count):
        made = len(ids) - len(prompt)
        return (own[made : made + count] + 1) % VOCAB

    plans = _count_steps(model, monkeypatch)
    np.testing.assert_array_equal(
        model.generate(prompt, 60, proposer=wrong, prompt_lookup_num_tokens=8), plain
    )
    verify = [p for p in plans if p.every_token]
    chained = [p for p in plans if p.chain > 1]
    assert len(verify) <= 8 and chained, [(p.tokens, p.chain) for p in plans]


def test_rejected_drafts_leave_nothing_behind(model):
    """A session that decoded speculatively holds what plain decoding holds (its ids and cached
    count), and goes on as plain decoding does."""
    rng = np.random.default_rng(5)
    prompt = _repetitive(rng, 18)
    plain, fast = model.session(), model.session()
    a = plain.generate(prompt, 17)
    b = fast.generate(prompt, 17, prompt_lookup_num_tokens=6)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(plain.token_ids[0], fast.token_ids[0])
    assert plain.lengths[0] == fast.lengths[0] and plain.cached[0] == fast.cached[0]
    more = rng.integers(0, VOCAB, 3)
    np.testing.assert_array_equal(plain.step(more), fast.step(more))
    np.testing.assert_array_equal(
        plain.generate([], 12), fast.generate([], 12, prompt_lookup_num_tokens=4)
    )


def test_streams_and_scores_are_plain_decodings(model):
    rng = np.random.default_rng(6)
    prompt = _repetitive(rng, 15)
    plain = list(model.stream(prompt, 16))
    fast = list(model.stream(prompt, 16, prompt_lookup_num_tokens=4))
    assert len(plain) == len(fast)
    for a, b in zip(plain, fast):
        np.testing.assert_array_equal(a, b)
    settings = dict(output_scores=True, output_logits=True, return_dict_in_generate=True)
    want = model.generate(prompt, 10, temperature=0.8, seed=2, **settings)
    got = model.generate(
        prompt, 10, temperature=0.8, seed=2, prompt_lookup_num_tokens=3, **settings
    )
    np.testing.assert_array_equal(got.sequences, want.sequences)
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(got.scores, want.scores):
        np.testing.assert_array_equal(a, b)


def test_end_ids_stop_as_plain_decoding_stops(model):
    rng = np.random.default_rng(8)
    prompts = [_repetitive(rng, 15), _repetitive(rng, 22)]
    plain = model.generate(prompts, 25)
    end = int(plain[0][len(prompts[0]) + 5])
    want = model.generate(prompts, 25, eos_token_id=end, pad_token_id=1)
    got = model.generate(prompts, 25, eos_token_id=end, pad_token_id=1, prompt_lookup_num_tokens=5)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "options,error",
    [
        ({"prompt_lookup_num_tokens": -1}, bg.ArgumentError),
        ({"prompt_lookup_num_tokens": 2.5}, bg.ArgumentError),
        ({"prompt_lookup_num_tokens": "4"}, bg.ArgumentError),
        ({"prompt_lookup_num_tokens": 65}, bg.ArgumentError),
        ({"max_matching_ngram_size": 0}, bg.ArgumentError),
        ({"proposer": 3}, bg.ArgumentError),
    ],
)
def test_bad_speculative_arguments(model, options, error):
    with pytest.raises(error):
        model.generate(np.arange(4), 4, **options)
    np.testing.assert_array_equal(model.generate(np.arange(4), 4), model.generate(np.arange(4), 4))

"""The decoder's step layer: Steps over KV cache slots (sequences joining and leaving a batch
without the others' caches moving), the session's primitives (feed, decode, accept, truncate),
and the checks on what a step is given."""

import dataclasses

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference
from bitnet_gpu.models import BitNetConfig, BitNetModel, Pick, Step, StepPlan

VOCAB = 384


@pytest.fixture(scope="module")
def model():
    config = BitNetConfig.preset("tiny", tie_word_embeddings=False)
    return BitNetModel.random(config, seed=5, embedding_dtype=np.float32, max_tokens=64)


def _step(slots, starts, ids, pick=Pick.LAST_LOGITS, **kwargs):
    return Step(
        np.array(slots),
        np.array(starts),
        tuple(np.asarray(i, np.int32) for i in ids),
        pick,
        **kwargs,
    )


def test_sequences_in_any_slots_step_as_alone(model):
    """Three prompts prefilled one at a time into slots 3, 0 and 2 of a pool of 4, then decoded
    together in another order and with one of them leaving: every step's logits are the
    reference's for that sequence alone, and its greedy ids are the reference's."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, VOCAB, n) for n in (5, 9, 3)]
    slots = [3, 0, 2]
    pool = model.runner.pool(4)
    params = model.reference_params()
    held = [list(p) for p in prompts]
    for prompt, slot in zip(prompts, slots):
        logits = model.runner.run(pool, _step([slot], [0], [prompt])).logits()
        want = reference.bitnet_forward(params, model.config, np.array(prompt)[None])[0, -1]
        np.testing.assert_allclose(logits[0], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    order = [2, 0, 1]  # sequences in the step's rows
    for step in range(6):
        if step == 3:
            order = [2, 1]  # sequence 0 leaves; the others' caches stay where they are
        nexts = [
            int(
                np.argmax(
                    reference.bitnet_forward(params, model.config, np.array(held[s])[None])[0, -1]
                )
            )
            for s in order
        ]
        result = model.runner.run(
            pool,
            _step(
                [slots[s] for s in order],
                [len(held[s]) for s in order],
                [[n] for n in nexts],
                Pick.LAST_LOGITS,
            ),
        )
        for row, (s, n) in enumerate(zip(order, nexts)):
            held[s].append(n)
            want = reference.bitnet_forward(params, model.config, np.array(held[s])[None])[0, -1]
            got = result.logits()[row]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_step_decodes_a_chain_and_picks_at_every_token(model):
    """A chain of 4 greedy decode steps gives the ids of 4 steps of one; a pick at every token
    (a verify step) gives each fed token's argmax, which is the reference's."""
    prompt = np.random.default_rng(8).integers(0, VOCAB, 6)
    pool = model.runner.pool(1)
    first = model.runner.run(pool, _step([0], [0], [prompt], Pick.ARGMAX)).ids()
    chained = model.runner.run(pool, _step([0], [6], [first], Pick.ARGMAX, chain=4))
    chain = [int(chained.ids(i)[0]) for i in range(4)]
    greedy = reference.bitnet_generate(model.reference_params(), model.config, prompt[None], 5)[0]
    assert [int(first[0])] + chain == list(greedy[6:])
    verify = model.runner.run(pool, _step([0], [0], [greedy[:10]], Pick.ARGMAX, every_token=True))
    assert verify.plan.every_token and verify.ids().shape == (1, 10)
    np.testing.assert_array_equal(verify.ids()[0, 5:], greedy[6:11])


def test_steps_are_checked_before_anything_runs(model):
    pool = model.runner.pool(2)
    with pytest.raises(bg.ArgumentError, match="slots must lie"):
        model.runner.run(pool, _step([2], [0], [[1, 2]]))
    with pytest.raises(bg.ArgumentError, match="share a slot"):
        model.runner.run(pool, _step([1, 1], [0, 0], [[1], [2]]))
    with pytest.raises(bg.ShapeError, match="exceed max_tokens"):
        model.runner.run(pool, _step([0], [63], [[1, 2]]))
    with pytest.raises(bg.ShapeError, match="new ids"):
        _step([0], [0], [[]])
    with pytest.raises(bg.ArgumentError, match="chain"):
        _step([0], [0], [[1, 2]], chain=2)
    with pytest.raises(bg.ArgumentError, match="sampling"):
        _step([0], [0], [[1]], Pick.SAMPLE)
    with pytest.raises(bg.ShapeError):
        _step([0, 1], [0], [[1], [2]])
    logits = model.runner.run(pool, _step([1], [0], [[1, 2, 3]])).logits()
    assert logits.shape == (1, VOCAB) and np.isfinite(logits).all()


def test_plans_key_the_recorded_graphs(model):
    """A pool records a graph for each plan once; prefill plans beyond the policy's count are
    dropped, the least recently used first."""
    pool = model.runner.pool(1)
    for tokens in (2, 3, 4, 2):
        model.runner.run(pool, _step([0], [0], [np.arange(tokens)]))
    plans = pool.graphs.plans()
    assert all(isinstance(p, StepPlan) for p in plans)
    assert [p.tokens for p in plans] == [4, 2]  # kept_prefill_graphs = 2, most recent last


def test_session_truncate_forgets_tokens(model):
    """Tokens a session forgets (truncate) leave nothing behind: generating again from there gives
    what it gave the first time."""
    prompt = np.random.default_rng(9).integers(0, VOCAB, 4)
    session = model.session()
    first = session.generate(prompt, 9)
    assert session.lengths[0] == 13
    session.truncate(np.array([7]))  # the prompt and 3 new ids, the third pending
    assert session.lengths[0] == 7 and session.cached[0] == 6
    np.testing.assert_array_equal(session.token_ids[0], first[:7])
    again = session.generate([], 6)
    np.testing.assert_array_equal(again, first[7:])
    with pytest.raises(bg.ArgumentError, match="truncate"):
        session.truncate(np.array([0]))


@pytest.mark.parametrize("batch", [1, 3])
def test_a_verify_step_is_its_decode_steps_bit_for_bit(model, batch):
    """T tokens of each sequence in one verify step (the pick at every token) give, bit for bit,
    the logits and ids that T decode steps of one token give: what speculative decoding's identity
    with plain decoding rests on."""
    rng = np.random.default_rng(10 + batch)
    prompts = [rng.integers(0, VOCAB, n) for n in (5, 9, 2)[:batch]]
    tokens = 6
    feeds = [rng.integers(0, VOCAB, tokens) for _ in range(batch)]
    slots = np.arange(batch)
    logits = {}
    for way in ("steps", "verify"):
        pool = model.runner.pool(batch)
        model.runner.run(pool, _step(slots, [0] * batch, prompts))
        starts = np.array([len(p) for p in prompts])
        if way == "steps":
            rows = []
            for t in range(tokens):
                step = _step(slots, starts + t, [f[t : t + 1] for f in feeds], Pick.ARGMAX,
                             keep_logits=True)  # fmt: skip
                rows.append(model.runner.run(pool, step).logits())
            logits[way] = np.stack(rows, axis=1)
        else:
            step = _step(slots, starts, feeds, Pick.ARGMAX, keep_logits=True, every_token=True)
            result = model.runner.run(pool, step)
            logits[way] = result.logits()
            ids = result.ids()
    np.testing.assert_array_equal(logits["verify"], logits["steps"])
    np.testing.assert_array_equal(ids, logits["steps"].argmax(axis=-1))
    # Without the logits, every token's pick goes through the screened head: the same ids.
    pool = model.runner.pool(batch)
    model.runner.run(pool, _step(slots, [0] * batch, prompts))
    step = _step(slots, starts, feeds, Pick.ARGMAX, every_token=True)
    assert model.runner.plan(step).screened == model.screened_head
    np.testing.assert_array_equal(model.runner.run(pool, step).ids(), ids)


def test_long_prompts_feed_in_chunks(model):
    """A prompt of more than the policy's prefill_chunk tokens runs as steps of that many: its
    logits are the reference's, every token's (forward) or the last's (step), greedy ids too,
    for ragged batches whose sequences end in different chunks."""
    chunked = BitNetModel.random(
        BitNetConfig.preset("tiny", tie_word_embeddings=False), seed=5,
        embedding_dtype=np.float32, max_tokens=64,
    )  # fmt: skip
    chunked.policy = dataclasses.replace(chunked.policy, prefill_chunk=7)
    rng = np.random.default_rng(12)
    prompts = [rng.integers(0, VOCAB, n) for n in (23, 5, 15)]
    params = model.reference_params()
    for b, p in enumerate(prompts):
        want = reference.bitnet_forward(params, model.config, np.array(p)[None])[0]
        got = chunked.forward(p)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    steps = chunked.session(3).step(prompts)
    for b, p in enumerate(prompts):
        want = reference.bitnet_forward(params, model.config, np.array(p)[None])[0, -1]
        np.testing.assert_allclose(steps[b], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    for got, want in zip(chunked.generate(prompts, 6), model.generate(prompts, 6)):
        np.testing.assert_array_equal(got, want)
    assert all(p.tokens <= 7 for p in chunked.recorded_plans())

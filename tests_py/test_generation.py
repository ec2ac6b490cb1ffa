"""Generation as transformers users expect it: batches of prompts of different lengths (a list of
sequences, or padding with an attention mask on either side), each step's logits and scores,
and the public decode-step API (DecodeSession) that keeps a KV cache between calls."""

import numpy as np
import pytest

import bitnet_gpu as bg
from bitnet_gpu import reference
from bitnet_gpu.models import BitNetConfig, BitNetModel, DecodeSession, GenerateOutput
from conftest import check_logits

VOCAB = 384


@pytest.fixture(scope="module")
def model():
    config = BitNetConfig.preset("tiny", tie_word_embeddings=False)
    return BitNetModel.random(config, seed=3, embedding_dtype=np.float32)


def _prompts(seed, lengths):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, n) for n in lengths]


def _padded(prompts, side, pad=0):
    """[B, T] ids padded before ("left") or after ("right") each prompt, and the mask."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for b, p in enumerate(prompts):
        at = slice(width - len(p), width) if side == "left" else slice(0, len(p))
        ids[b, at], mask[b, at] = p, 1
    return ids, mask


@pytest.mark.parametrize("seed,lengths", [(30, (3, 9, 1)), (31, (12, 2)), (32, (5, 5, 4, 1))])
def test_ragged_greedy_generation_is_each_prompts_own(model, seed, lengths):
    """Prompts of different lengths, as a list: each sequence's ids are the reference's for that
    prompt alone (its own positions from 0), through chunked decode replays."""
    prompts = _prompts(seed, lengths)
    out = model.generate(prompts, 20)
    ref = reference.bitnet_generate(model.reference_params(), model.config, prompts, 20)
    assert isinstance(out, list) and len(out) == len(prompts)
    for got, want in zip(out, ref):
        np.testing.assert_array_equal(got, want)
    assert len(np.unique(np.concatenate([o[-20:] for o in out]))) > 6


@pytest.mark.parametrize("side", ["left", "right"])
def test_attention_mask_padding_on_either_side(model, side):
    """A padded [B, T] batch with transformers' attention_mask: the padding stays where it was in
    the returned sequences, the new ids follow, and they are the ragged list's; the padding's
    values do not matter."""
    prompts = _prompts(33, (7, 2, 4))
    ids, mask = _padded(prompts, side)
    out = model.generate(ids, 10, attention_mask=mask)
    assert out.shape == (3, ids.shape[1] + 10)
    np.testing.assert_array_equal(out[:, : ids.shape[1]], ids)
    ragged = model.generate(prompts, 10)
    np.testing.assert_array_equal(out[:, ids.shape[1] :], np.stack([r[-10:] for r in ragged]))
    other, _ = _padded(prompts, side, pad=VOCAB - 1)
    np.testing.assert_array_equal(
        model.generate(other, 10, attention_mask=mask)[:, ids.shape[1] :], out[:, ids.shape[1] :]
    )


def test_forward_with_an_attention_mask(model):
    """Logits of a padded batch: each sequence's rows are the reference's for it alone; padding's
    rows are zeros."""
    prompts = _prompts(34, (6, 1, 9))
    ids, mask = _padded(prompts, "left")
    logits = model.forward(ids, attention_mask=mask)
    assert logits.shape == ids.shape + (VOCAB,)
    params = model.reference_params()
    for b, p in enumerate(prompts):
        ref, ties = reference.bitnet_forward(params, model.config, p[None], True)
        check_logits(logits[b][mask[b] == 1][None], ref, ties)
        assert (logits[b][mask[b] == 0] == 0).all()


@pytest.mark.parametrize("top_k,top_p", [(20, None), (None, 0.9)])
def test_ragged_sampled_generation_keys_draws_by_each_sequences_position(model, top_k, top_p):
    """temperature 0.8: sequence b's token at position p is reference.sample_rows's draw from the
    reference's logits of that sequence with step p and row b, as alone at row b; chunked
    replays draw what one step a replay draws."""
    if top_p is not None and not model.device.info.features["int64_atomics"]:
        pytest.skip("top-p needs 64-bit integer atomics")
    prompts = _prompts(35, (4, 10, 2))
    kwargs = dict(temperature=0.8, top_k=top_k, top_p=top_p, seed=7)
    out = model.generate(prompts, 16, **kwargs)
    model.decode_chunk = 1
    try:
        for got, again in zip(out, model.generate(prompts, 16, **kwargs)):
            np.testing.assert_array_equal(again, got)
    finally:
        model.decode_chunk = 8
    params, matched = model.reference_params(), 0
    for b, (prompt, got) in enumerate(zip(prompts, out)):
        for position in range(len(prompt), len(got)):
            logits = reference.bitnet_forward(params, model.config, got[None, :position])[:, -1]
            want = reference.sample_rows(logits, 0.8, top_k, 7, position, top_p, b)[0]
            if want != got[position]:  # a near tie of two kept scores or of the nucleus rule
                scores = reference.sampling_scores(logits[0], 0.8, 7, position, b)
                near = scores[want] - scores[got[position]] <= 1e-3 * (1 + np.abs(logits).max())
                nucleus = reference.nucleus_threshold(logits[0], top_k, top_p, 0.8)[1] < 1e-3
                assert near or nucleus, (b, position)
                break
            matched += 1
    assert matched >= 36


def test_each_steps_logits_and_scores(model):
    """output_logits: each step's logits are the float head's for the sequence so far (the
    reference's last row); the ids are those generate gives without them. output_scores: greedy
    scores are the logits; sampled ones are logits / t over the kept values, -inf elsewhere, and
    the drawn id is always kept."""
    prompts = _prompts(36, (5, 3))
    result = model.generate(
        prompts, 6, output_logits=True, output_scores=True, return_dict_in_generate=True
    )
    assert isinstance(result, GenerateOutput) and len(result.logits) == 6
    for got, want in zip(result.sequences, model.generate(prompts, 6)):
        np.testing.assert_array_equal(got, want)
    params = model.reference_params()
    for step, (logits, scores) in enumerate(zip(result.logits, result.scores)):
        assert logits.shape == (2, VOCAB) and logits.dtype == np.float32
        np.testing.assert_array_equal(scores, logits)
        for b, sequence in enumerate(result.sequences):
            ref, ties = reference.bitnet_forward(
                params, model.config, sequence[None, : len(prompts[b]) + step], True
            )
            check_logits(logits[b][None, None], ref[:, -1:], ties[:, -1:])
            assert logits[b].argmax() == sequence[len(prompts[b]) + step]
    one = model.generate(
        prompts[0],
        5,
        temperature=0.7,
        top_k=12,
        seed=2,
        return_dict_in_generate=True,
        output_scores=True,
    )
    assert one.logits is None and len(one.scores) == 5
    np.testing.assert_array_equal(
        one.sequences, model.generate(prompts[0], 5, temperature=0.7, top_k=12, seed=2)
    )
    for step, scores in enumerate(one.scores):
        kept = np.isfinite(scores[0])
        assert kept.sum() == 12 and kept[one.sequences[5 + step]]


def test_a_session_steps_like_generate(model):
    """The decode-step API: step() feeds ids and returns the next token's logits; a greedy loop
    over it gives generate's ids; the session's lengths and ids follow."""
    prompt = _prompts(37, (6,))[0]
    session = model.session()
    assert isinstance(session, DecodeSession) and session.lengths.tolist() == [0]
    logits = session.step(prompt)
    assert logits.shape == (VOCAB,)
    ids = list(prompt)
    for _ in range(12):
        ids.append(int(logits.argmax()))
        logits = session.step(np.array(ids[-1:]))
    np.testing.assert_array_equal(ids, model.generate(prompt, 12))
    assert session.lengths.tolist() == [18]
    np.testing.assert_array_equal(session.token_ids[0], ids)
    session.reset()
    assert session.lengths.tolist() == [0]
    np.testing.assert_array_equal(session.step(prompt), model.session().step(prompt))


def test_a_session_continues_a_conversation(model):
    """generate, then more tokens, then generate again from the cache: the ids are one greedy
    generation over the whole text (the last generated id is fed with the next turn), also after
    stopping a stream in the middle of a decode chunk."""
    first, second = _prompts(38, (5, 4))
    session = model.session()
    turn1 = session.generate(first, 9)
    turn2 = session.generate(second, 7)
    whole = np.concatenate([turn1, second])
    params = model.reference_params()
    ref = reference.bitnet_generate(params, model.config, whole[None], 7)[0]
    np.testing.assert_array_equal(np.concatenate([turn1, turn2]), ref)
    assert session.lengths.tolist() == [len(ref)]
    np.testing.assert_array_equal(session.token_ids[0], ref)

    stopped = model.session()
    stream = stopped.stream(first, 20)
    taken = [int(next(stream)[0]) for _ in range(3)]  # inside the first chunk of 8
    stream.close()
    rest = stopped.generate(second, 4)
    ids = np.concatenate([first, taken, second])
    np.testing.assert_array_equal(rest[len(second) :], model.generate(ids, 4)[len(ids) :])


def test_sessions_hold_their_own_caches(model):
    """Two sessions interleaved give what each gives alone; generate() does not touch them."""
    a, b = _prompts(39, (4, 6))
    alone_a, alone_b = model.generate(a, 8), model.generate(b, 8)
    one, two = model.session(), model.session()
    one.step(a)
    two.step(b)
    model.generate(b, 3)
    np.testing.assert_array_equal(one.generate([], 8)[-8:], alone_a[-8:])
    np.testing.assert_array_equal(two.generate([], 8)[-8:], alone_b[-8:])
    assert one.cache_nbytes > 0


def test_generate_refuses_another_models_session(model):
    other = BitNetModel.random(model.config, seed=4, embedding_dtype=np.float32)
    for session in (other.session(), "a session"):
        with pytest.raises(bg.ArgumentError, match="expected a DecodeSession of this model's"):
            model.generate(_prompts(5, (3,))[0], 2, session=session)


def test_a_batch_session_feeds_different_lengths_at_different_positions(model):
    """A batch session after a ragged prompt: another ragged feed lands at each sequence's own
    position (prefill attention and RoPE per sequence)."""
    first = _prompts(40, (3, 7))
    more = _prompts(41, (5, 1))
    session = model.session(batch=2)
    session.step(first)
    logits = session.step(more)
    assert logits.shape == (2, VOCAB)
    assert session.lengths.tolist() == [8, 8]
    params = model.reference_params()
    for b in range(2):
        whole = np.concatenate([first[b], more[b]])[None]
        ref, ties = reference.bitnet_forward(params, model.config, whole, True)
        check_logits(logits[b][None, None], ref[:, -1:], ties[:, -1:])


def test_finished_sequences_take_the_padding_id(model):
    """With end ids, a sequence that has ended takes pad_token_id (else the config's, else the
    first end id) while the others go on; all ended stops generation."""
    prompts = _prompts(42, (4, 6))
    free = model.generate(prompts, 12)
    end = int(free[0][4 + 2])  # the first sequence's third new token
    out = model.generate(prompts, 12, eos_token_id=end, pad_token_id=1)
    first = out[0][4:]
    stop = int(np.flatnonzero(first == end)[0])
    assert (first[stop + 1 :] == 1).all()
    if end not in free[1][6:]:
        np.testing.assert_array_equal(out[1], free[1][: len(out[1])])
    model.generation_config = {"pad_token_id": 2}
    try:
        again = model.generate(prompts, 12, eos_token_id=end)
        assert (again[0][4 + stop + 1 :] == 2).all()
    finally:
        model.generation_config = {}


def test_bad_inputs_leave_the_session_usable(model):
    session = model.session(batch=2)
    with pytest.raises(bg.ShapeError, match="2"):
        session.step([np.arange(3)])  # one sequence for two
    ids, mask = _padded(_prompts(43, (3, 5)), "left")
    holed = mask.copy()
    holed[1, 2] = 0
    with pytest.raises(bg.ArgumentError, match="one run of ones"):
        session.step(ids, attention_mask=holed)
    with pytest.raises(bg.ArgumentError, match="0 \\(padding\\) and 1"):
        session.step(ids, attention_mask=mask * 2)
    with pytest.raises(bg.ShapeError, match="attention_mask"):
        session.step(ids, attention_mask=mask[:, 1:])
    with pytest.raises(bg.ArgumentError, match="ids must lie"):
        session.step([np.array([1, VOCAB]), np.array([2])])
    with pytest.raises(bg.DTypeError):
        session.step([np.array([1.5]), np.array([2.0])])
    with pytest.raises(bg.ShapeError, match="no tokens"):
        session.step([np.array([1]), np.array([], np.int64)])
    with pytest.raises(bg.ShapeError, match="max_tokens"):
        session.generate(ids, model.max_tokens, attention_mask=mask)
    assert session.lengths.tolist() == [0, 0]
    logits = session.step(ids, attention_mask=mask)
    assert np.isfinite(logits).all() and session.lengths.tolist() == [3, 5]
    with pytest.raises(bg.ArgumentError, match="batch"):
        model.session(batch=0)

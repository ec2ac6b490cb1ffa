"""bench_model.py's phases of many tokens a step: batches of sequences beside the bf16 batched
anchor (../shared/anchors/anchor_batch.py, carried as .anchors/ to the GPU machine), and verify
steps (T tokens of one sequence, the pick at every token) against a one-token step."""

from __future__ import annotations

import importlib.util
import os
import time

import numpy as np

from bitnet_gpu.models import Pick, Step

BATCH_PROMPT = 192  # the issue's [B, 192] prompts; with BATCH_NEW new tokens, context 256
BATCH_NEW = 64
VERIFY_CONTEXT = 128


def anchor_module():
    """anchor_batch.py (its M class and time_graph) from .anchors/ or ../shared/anchors/, or
    None where neither holds it."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in (
        os.path.join(here, "..", ".anchors"),
        os.path.join(here, "..", "..", "shared", "anchors"),
    ):
        path = os.path.join(folder, "anchor_batch.py")
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location("anchor_batch", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


def anchor_step_us(torch, anchor, batch, context):
    """Microseconds of the bf16 CUDA-graph step of `batch` sequences at `context`
    (torch.compile'd layers), timed in this process."""
    model = anchor.M(batch, context + 1)
    layer = torch.compile(model.layer, dynamic=False)
    tok = torch.randint(0, anchor.V, (batch,), device="cuda")
    pos = torch.tensor([context - 1], device="cuda")
    return anchor.time_graph(lambda: model.step(tok, pos, context, layer))


def anchor_tokens_per_s(torch, anchor, batch, context):
    """(aggregate tokens/s, seconds a step) of the anchor's step (its weights freed after)."""
    us = anchor_step_us(torch, anchor, batch, context)
    torch.cuda.empty_cache()
    return batch * 1e6 / us, us * 1e-6


def batch_rows(model, batches, tokens, repeats, steps, torch, helpers, prompt=BATCH_PROMPT):
    """One row a batch size B: aggregate tokens/s of generate on a [B, prompt] prompt (greedy),
    the GPU time of a greedy decode step of B sequences at the context it ends at and of a sampled
    one (helpers.SAMPLING's draw, through the screened and the float16 head), device memory a
    sequence (the KV cache of max_tokens, the graphs), and the anchor's tokens/s in this run."""
    device = model.device
    prompt_tokens = min(prompt, model.max_tokens - BATCH_NEW - 1)
    new = min(tokens, BATCH_NEW)
    context = prompt_tokens + new
    anchor = anchor_module() if torch is not None else None
    rows = []
    for batch in batches:
        before = device.memory_stats()["in_use_bytes"]
        prompts = np.random.default_rng(3).integers(
            0, model.config.vocab_size, (batch, prompt_tokens)
        )
        rate = batch * helpers.generate_rate(model, prompts, new, model.decode_chunk, repeats)
        in_use = device.memory_stats()["in_use_bytes"] - before
        step = helpers.decode_step(model, context - 1, batch)
        step()
        gpu = helpers.gpu_seconds(model, step, steps)
        ops = helpers.split(helpers.per_op(model, step))
        # The sampled step (generate's sampled run's settings), through the screened head and
        # through the float16 head.
        sampled = {}
        screened = model.screened_head
        for head, on in (("screened", screened), ("float_head", False)):
            model.screened_head = on
            draw = helpers.decode_step(model, context - 1, batch, helpers.SAMPLING)
            draw()
            sampled[head] = helpers.gpu_seconds(model, draw, steps)
        model.screened_head = screened
        row = {
            "phase": "generate_batch",
            "batch": batch,
            "prompt": prompt_tokens,
            "tokens": new,
            "context": context,
            "max_tokens": model.max_tokens,
            "tokens_per_s": rate,
            "decode_step_gpu_s": gpu,
            "decode_step_split_s": ops,
            "sampled_decode_step_gpu_s": sampled["screened"],
            "sampled_float_head_decode_step_gpu_s": sampled["float_head"],
            "memory_per_sequence_bytes": in_use / batch,
        }
        if anchor is not None:
            row["anchor_tokens_per_s"], row["anchor_step_s"] = anchor_tokens_per_s(
                torch, anchor, batch, context
            )
            row["tokens_per_s_over_anchor"] = rate / row["anchor_tokens_per_s"]
        rows.append(row)
        print(
            f"generate {new} tokens after {prompt_tokens} for {batch} sequences: {rate:.0f} "
            f"tokens/s; a decode step at context {context} {gpu * 1e6:.0f} us GPU; "
            f"{in_use / batch / 2**20:.0f} MiB a sequence (max_tokens {model.max_tokens}); "
            f"sampled {sampled['screened'] * 1e6:.0f} us GPU "
            f"({sampled['float_head'] * 1e6:.0f} through the float16 head)"
            + (
                f"; bf16 anchor {row['anchor_tokens_per_s']:.0f} tokens/s "
                f"({row['tokens_per_s_over_anchor']:.2f}x)"
                if anchor is not None
                else ""
            ),
            flush=True,
        )
        for kind, seconds in ops.items():
            print(f"    {kind:40s} {seconds * 1e6:9.1f} us")
        model.runner.release_shared(batch)  # the batch's KV cache and graphs, before the next
    one = next((r for r in rows if r["batch"] == 1), None)
    for row in rows:
        if one:
            row["decode_step_over_one"] = row["decode_step_gpu_s"] / one["decode_step_gpu_s"]
    return rows


def verify_rows(model, token_counts, steps, helpers):
    """A verify step (T tokens of one sequence after VERIFY_CONTEXT cached ones, the argmax at
    every token: what speculative decoding checks drafts with) against a greedy one-token step at
    that context: GPU time of each and their ratio."""
    context = min(VERIFY_CONTEXT, model.max_tokens - max(token_counts) - 1)
    pool = model.runner.shared_pool(1)
    ids = np.random.default_rng(4).integers(0, model.config.vocab_size, context + max(token_counts))
    model.runner.run(
        pool,
        Step(np.array([0]), np.array([0]), (ids[:context].astype(np.int32),), Pick.LAST_LOGITS),
    )

    def verify(tokens):
        step = Step(
            np.array([0]),
            np.array([context]),
            (ids[context : context + tokens].astype(np.int32),),
            Pick.ARGMAX,
            every_token=tokens > 1,
        )
        return lambda: model.runner.run(pool, step).ids()

    one = helpers.gpu_seconds(model, verify(1), steps)
    rows = []
    for tokens in token_counts:
        gpu = helpers.gpu_seconds(model, verify(tokens), steps)
        rows.append(
            {
                "phase": "verify",
                "tokens": tokens,
                "context": context,
                "gpu_s": gpu,
                "one_token_gpu_s": one,
                "over_one_token": gpu / one,
            }
        )
        print(
            f"verify {tokens} tokens of one sequence after {context}: {gpu * 1e6:.0f} us GPU "
            f"({gpu / one:.2f}x a one-token step's {one * 1e6:.0f} us)",
            flush=True,
        )
    return rows


def timed(label, fn):
    start = time.perf_counter()
    value = fn()
    print(f"({label}: {time.perf_counter() - start:.1f} s)")
    return value


SPECULATIVE_PROMPT = 128
SPECULATIVE_NEW = 128


def speculative_rows(model, counts, repeats, helpers, new=SPECULATIVE_NEW):
    """Tokens/s of one stream with speculative decoding beside plain greedy generate, for k in
    `counts`: drafts that are all accepted (a proposer handing in plain decoding's own
    continuation), none (random ids), and prompt lookup on a copy-heavy prompt (64 random ids
    twice); mean accepted drafts a verify step, counted from the steps the runner replays."""
    vocab = model.config.vocab_size
    rng = np.random.default_rng(5)
    half = rng.integers(0, vocab, SPECULATIVE_PROMPT // 2)
    prompt = np.concatenate([half, half])
    new = min(new, model.max_tokens - SPECULATIVE_PROMPT - 1)
    plain_rate = helpers.generate_rate(model, prompt, new, model.decode_chunk, repeats)
    own = model.generate(prompt, new)[SPECULATIVE_PROMPT:]
    noise = np.random.default_rng(6)

    def all_right(ids, count):
        made = len(ids) - SPECULATIVE_PROMPT
        return own[made : made + count]

    def never_right(ids, count):
        return noise.integers(0, vocab, count)

    plans, run = [], model.runner.run

    def counted(pool, step):
        plans.append(model.runner.plan(step))
        return run(pool, step)

    rows = []
    for accepted, options in [
        ("all", {"proposer": all_right}),
        ("none", {"proposer": never_right}),
        ("lookup", {}),
    ]:
        for k in counts:
            settings = dict(prompt_lookup_num_tokens=k, **options)
            same = np.array_equal(model.generate(prompt, new, **settings)[SPECULATIVE_PROMPT:], own)
            rate = helpers.generate_rate(
                model, prompt, new, model.decode_chunk, repeats, **settings
            )
            plans.clear()
            model.runner.run = counted
            try:
                model.generate(prompt, new, **settings)
            finally:
                model.runner.run = run
            verify = [p for p in plans if p.every_token]
            plain = sum(p.chain for p in plans if p.tokens == 1 and not p.every_token)
            by_verify = new - 1 - plain  # the prompt's step makes the first id
            mean = (by_verify - len(verify)) / len(verify) if verify else 0.0
            rows.append(
                {
                    "phase": "speculative",
                    "accepted": accepted,
                    "k": k,
                    "tokens": new,
                    "tokens_per_s": rate,
                    "plain_tokens_per_s": plain_rate,
                    "over_plain": rate / plain_rate,
                    "mean_accepted": mean,
                    "verify_steps": len(verify),
                    "same_ids_as_plain": same,
                }
            )
            print(
                f"speculative, drafts {accepted:6s} k {k}: {rate:.0f} tokens/s "
                f"({rate / plain_rate:.2f}x plain greedy's {plain_rate:.0f}); {len(verify)} verify "
                f"steps, {mean:.2f} drafts accepted each{'' if same else '; IDS DIFFER'}",
                flush=True,
            )
    return rows

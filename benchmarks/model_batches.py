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


def batch_rows(model, batches, tokens, repeats, steps, torch, helpers):
    """One row a batch size B: aggregate tokens/s of generate on a [B, prompt] prompt (greedy),
    the GPU time of a greedy decode step of B sequences at the context it ends at, device memory a
    sequence (the KV cache of max_tokens, the graphs), and the anchor's tokens/s in this run."""
    device = model.device
    prompt_tokens = min(BATCH_PROMPT, model.max_tokens // 2)
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
            f"{in_use / batch / 2**20:.0f} MiB a sequence (max_tokens {model.max_tokens})"
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

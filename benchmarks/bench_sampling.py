"""Drawing the next token on the GPU: bitnet_gpu.sample_logits (shaders/sampling/sample_rows.comp,
Gumbel-max over the top-k kept logits; sample_nucleus.comp for top-p) beside PyTorch's usual
top-k / top-p sampling in the same run, and a sampled decode step's head: the float16 head and the
draw against the screened draw.

    python3 benchmarks/bench_sampling.py [--repeats 10] [--json FILE] [--vocab 128256] [--hidden
    2560]

Logits N(0, 3) float32 of (rows, vocab) with the 2B4T vocabulary and a smaller one; temperature
0.8 and top_k None, 50 and 1000, top_p 0.9 without and with top_k 50. Ours: decoder_ops.sample_rows
recorded as a graph and timed as a whole (one timestamp pair), the step an input; also profiled
per kernel (the radix-select passes, the nucleus passes and the draw). Each draw is checked
against reference.sample_rows (the same formulas in float64: equal, or a near tie of two kept
scores or of the nucleus rule, which the row counts as 'near ties'). PyTorch (CUDA events): topk's
k-th value as a threshold, logits below it set to -inf; for top-p, sort, softmax, cumsum and the
tokens whose cumulative share from below stays within 1 - p set to -inf; then softmax of logits /
t and torch.multinomial (what transformers' TopKLogitsWarper, TopPLogitsWarper and sampling do),
all on the GPU.

The head: a float16 head of N(0, 1) values of (vocab, hidden) and hidden states as bench_head.py
draws them (logits of about 50 standard deviations' spread), and one scaled to logits of 3 (as
a trained model's are, where many rows lie within reach of the largest); linear_rows +
sample_rows against screened_sample (the int8 screening copy, the candidates' rows exactly, the
draw over them), whose ids must be equal, with top_k None and 50, top_p None and 0.9; the
candidates counted from screened_sample's exact output.
"""

from __future__ import annotations

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import decoder_ops, reference
from bitnet_gpu.models import screening_tables
from bitnet_gpu.sampling import sampling_params
from common import (
    arguments,
    by_kernel,
    profiled,
    timed_graph,
    torch_cuda,
    torch_time,
    write_results,
)

CASES = [(1, 128256), (8, 128256), (1, 32000)]
SETTINGS = [(None, None), (50, None), (1000, None), (None, 0.9), (50, 0.9)]  # (top_k, top_p)
TEMPERATURE = 0.8


def agreement(logits, drawn, top_k, seed, step, top_p=None):
    """(equal, near ties): rows drawing the reference's index, and rows whose index differs where
    the reference's two scores lie within 1e-6 relative or the nucleus rule within
    reference.NUCLEUS_MARGIN (anything else raises)."""
    differences = reference.sampling_differences(
        logits, drawn, TEMPERATURE, top_k, seed, step, top_p
    )
    for m, got, want, kept, best, gap in differences:
        if not (kept and gap <= 1e-6 * (1 + abs(best))):
            raise AssertionError(f"row {m}: drew {got} instead of {want} (score gap {gap})")
    return drawn.size - len(differences), len(differences)


def head_rows(args, device, torch, rng):
    """Rows of the head section: the float16 head and its draw against the screened draw."""
    v, k = args.vocab, args.hidden
    head_np = rng.standard_normal((v, k), np.float32).astype(np.float16)
    q_np, meta_np = screening_tables(head_np)
    head, head_q, head_meta = (bg.Tensor.from_numpy(a, device) for a in (head_np, q_np, meta_np))
    start = bg.Tensor.from_numpy(np.array([17], np.int32), device)
    rows = []
    nucleus = device.info.features["int64_atomics"]
    for state, spread in enumerate([1.0, 1.0, 3.0 / np.sqrt(k)]):
        h_np = (
            rng.standard_normal((1, k), np.float32) * (1 + 0.1 * rng.standard_normal(k, np.float32))
        ).astype(np.float32)
        h = bg.Tensor.from_numpy(h_np * np.float32(spread), device)
        for top_k, top_p in [(None, None), (50, None)] + (
            [(None, 0.9), (50, 0.9)] if nucleus else []
        ):
            params = bg.Tensor.from_numpy(
                sampling_params(TEMPERATURE, top_k, 5 + state, v, top_p), device
            )
            by_p = top_p is not None

            def float_head():
                return decoder_ops.sample_rows(
                    decoder_ops.linear_rows(h, head), params, start, 0, None, by_p
                )

            def screened():
                return decoder_ops.screened_sample(
                    h, head, head_q, head_meta, params, start, 0, None, None, by_p
                )

            exact = bg.Tensor.from_numpy(np.zeros(v, np.float32), device)
            screened_id = int(
                decoder_ops.screened_sample(
                    h, head, head_q, head_meta, params, start, 0, None, exact, by_p
                ).numpy()[0]
            )
            float_id = int(float_head().numpy()[0])
            row = {
                "state": state,
                "logit_spread": "random" if spread == 1.0 else "3",
                "top_k": top_k,
                "top_p": top_p,
                "screened_id": screened_id,
                "float_head_id": float_id,
                "candidates": int(np.isfinite(exact.numpy()).sum()),
            }
            for name, fn in (("float_head", float_head), ("screened", screened)):
                row[name + "_gpu_s"] = timed_graph(bg, device, fn, args.repeats)[0]
                row[name + "_kernels_s"] = by_kernel(profiled(bg, device, fn, 3)[1])
            row["speedup"] = row["float_head_gpu_s"] / row["screened_gpu_s"]
            rows.append(row)
            print(
                f"head {v} x {k}, state {state} ({row['logit_spread']}), top_k {top_k}, top_p "
                f"{top_p}: "
                f"screened draw {row['screened_gpu_s'] * 1e6:.1f} us "
                f"({row['candidates']} candidates) against the float16 head and the draw "
                f"{row['float_head_gpu_s'] * 1e6:.1f} us: {row['speedup']:.2f}x; ids "
                f"{screened_id} / {float_id}" + ("" if screened_id == float_id else "  MISMATCH")
            )
    return rows


def main():
    args = arguments(
        __doc__,
        lambda p: (
            p.add_argument("--vocab", type=int, default=128256),
            p.add_argument("--hidden", type=int, default=2560),
        ),
    )
    device = bg.default_device()
    torch = torch_cuda()
    rng = np.random.default_rng(0)
    results = {"device": device.name, "temperature": TEMPERATURE, "rows": []}
    print(f"device {device.name}; temperature {TEMPERATURE}")
    for rows, vocab in CASES:
        logits_np = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
        logits = bg.Tensor.from_numpy(logits_np, device)
        start = bg.Tensor.from_numpy(np.array([17], np.int32), device)
        if torch:
            logits_t = torch.from_numpy(logits_np).cuda()
        for top_k, top_p in SETTINGS:
            if top_p is not None and not device.info.features["int64_atomics"]:
                continue
            params = bg.Tensor.from_numpy(
                sampling_params(TEMPERATURE, top_k, 5, vocab, top_p), device
            )

            def draw():
                return decoder_ops.sample_rows(logits, params, start, 0, None, top_p is not None)

            equal, near = agreement(logits_np, draw().numpy(), top_k, 5, 17, top_p)
            seconds, _ = timed_graph(bg, device, draw, args.repeats)
            _, timings = profiled(bg, device, draw, 3)
            row = {
                "rows": rows,
                "vocab": vocab,
                "top_k": top_k,
                "top_p": top_p,
                "gpu_s": seconds,
                "kernels_s": by_kernel(timings),
                "equal_to_reference": equal,
                "near_ties": near,
            }
            if torch:

                def torch_draw():
                    x = logits_t / TEMPERATURE
                    if top_k is not None:
                        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
                        x = x.masked_fill(x < kth, float("-inf"))
                    if top_p is not None:
                        ordered, order = torch.sort(x, descending=False, dim=-1)
                        removed = torch.softmax(ordered, dim=-1).cumsum(dim=-1) <= 1 - top_p
                        removed[:, -1:] = False
                        x = x.masked_fill(removed.scatter(1, order, removed), float("-inf"))
                    return torch.multinomial(torch.softmax(x, dim=-1), 1)

                row["torch_s"] = torch_time(torch, torch_draw, args.repeats)
                row["speedup_vs_torch"] = row["torch_s"] / seconds
            results["rows"].append(row)
            print(
                f"({rows}, {vocab}) top_k {top_k}, top_p {top_p}: {seconds * 1e6:.1f} us"
                + (
                    f", PyTorch {row['torch_s'] * 1e6:.1f} us ({row['speedup_vs_torch']:.2f}x)"
                    if torch
                    else ""
                )
                + f"; ids: {equal} the reference's, {near} near ties"
            )
    results["head"] = head_rows(args, device, torch, rng)
    write_results(args.json, results)


if __name__ == "__main__":
    main()

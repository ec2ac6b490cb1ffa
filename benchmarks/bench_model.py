"""The BitNet b1.58 decoder end to end: decode and prefill tokens/s, GPU memory, where the time
goes, beside the same architecture in PyTorch eager (CUDA, float16 dense weights) in the same run.

    python3 benchmarks/bench_model.py [--config 2b4t] [--contexts 128,2048] [--prefill 512]
                                      [--kv-cache-dtype float32|float16] [--json FILE]

Random ternary weights of the config's shape. A decode step is one replay of the recorded graph
(embedding .. 30 layers .. head .. argmax) at a given context length: its wall time includes
copying the token id in, the submission, the wait and reading the next token id back. GPU time
comes from Vulkan timestamps (the whole graph, and per op for the split). The physical limit is
the bytes a step must read (packed projections, and the float16 head) over PyTorch's measured
device copy bandwidth. Greedy decode steps pick the next id through the head's int8 screening
copy (BitNetModel.screened_head); each context is also timed with the float16 head and
argmax_rows (screened_head off), in the same run. Greedy generation (model.generate, --generate
new tokens after a prompt of 128) is timed as a user sees it, tokens/s from the first generated
token to the last, with BitNetModel.decode_chunk's steps a replay and with one step a replay, and
sampled (temperature 0.8, top-k 50, drawn on the GPU: the same two ways; and with top-p 0.9 too,
which reads the float16 head), and for --batches sequences at once (tokens/s over all of them).
"""

from __future__ import annotations

import math
import re
import statistics
import sys
import time

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu.telemetry import TelemetrySampler
from bitnet_gpu.telemetry import summary as telemetry_summary
from bitnet_gpu.models import BitNetConfig, BitNetModel, Pick, Step
from bitnet_gpu.sampling import sampling_params
from common import arguments, median_wall, torch_copy_gbps, torch_cuda, write_results
from model_phases import BATCH_NEW, batch_rows, speculative_rows, verify_rows


def op_kind(label):
    """Groups kernel labels: bitlinear pre-pass and matvec/matmul, norms, attention, ..."""
    rules = [
        ("bitlinear_prepare", "bitlinear: activation int8 pre-pass"),
        ("bitlinear_(matvec|tiled|coopmat)|int8_interleave", "bitlinear: ternary matvec/matmul"),
        ("row_op|row_ops", "rms_norm"),
        ("attention", "attention"),
        ("rope", "rope"),
        ("binary", "residual add"),
        ("gated|elementwise", "relu2 * up"),
        ("linear_rows", "LM head (float16)"),
        # Several rows: the split rows, their int8 matmul with the head's copy, the brackets.
        ("head_screen|head_split_rows|head_brackets", "LM head: int8 screening"),
        ("head_verify", "LM head: candidates, exactly"),
        ("embedding", "embedding / gather"),
        ("argmax", "argmax"),
    ]
    for pattern, kind in rules:
        if re.search(pattern, label):
            return kind
    return label


def describe_state(state):
    """A telemetry summary as one line: SM clock, power, temperature, throttling."""
    parts = []
    for field, unit in [
        ("sm_clock_mhz", "MHz SM"),
        ("memory_clock_mhz", "MHz memory"),
        ("power_w", "W"),
        ("temperature_c", "C"),
        ("utilization", "busy"),
    ]:
        if state.get(field):
            median, most = state[field]
            parts.append(
                f"{median:.2f} / {most:.2f} {unit}"
                if field == "utilization"
                else f"{median:.0f} / {most:.0f} {unit}"
            )
    reasons = state.get("throttle_reasons")
    if reasons is not None:
        parts.append("throttled: " + (", ".join(reasons) or "never"))
    return ", ".join(parts)


def split(timings):
    kinds = {}
    for label, seconds in timings:
        kind = op_kind(label)
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


# The token every timed decode step feeds (any id would do).
DECODE_TOKEN = np.array([[17]], np.int32)


def replay(model, ids, context, pick, sampling=None):
    """One step of ids [B, T] after `context` cached tokens over the model's shared cache for B
    sequences (the same slots and positions every time): what generate runs a step (sampling:
    sampling_params' [6] for a draw)."""
    batch = ids.shape[0]
    ids = tuple(ids.astype(np.int32))
    step = Step(np.arange(batch), np.full(batch, context), ids, pick, sampling=sampling)
    return model.runner.run(model.runner.shared_pool(batch), step)


def fill_cache(model, tokens):
    """Real keys and values in the cache for `tokens` random tokens (a prefill, seed 2), so decode
    steps can run at any context up to that; returns those token ids [1, tokens]."""
    fill = (
        np.random.default_rng(2).integers(0, model.config.vocab_size, (1, tokens)).astype(np.int32)
    )
    replay(model, fill, 0, Pick.LAST_LOGITS)
    return fill


def decode_step(model, context, batch=1, sampling=None):
    """One decode step of DECODE_TOKEN for `batch` sequences after `context` cached tokens, as
    generate() runs it, greedy or with `sampling` (generate's keywords: temperature, top_k, seed;
    the next ids read back; through the screened head where model.screened_head)."""
    ids = np.repeat(DECODE_TOKEN, batch, axis=0)
    if sampling is None:
        return lambda: replay(model, ids, context, Pick.ARGMAX).ids()
    params = sampling_params(
        sampling["temperature"], sampling["top_k"], sampling["seed"], model.config.vocab_size
    )
    return lambda: replay(model, ids, context, Pick.SAMPLE, params).ids()


GENERATE_PROMPT = 128
SAMPLING = {"temperature": 0.8, "top_k": 50, "seed": 1}  # the generate row's sampled run
NUCLEUS = {**SAMPLING, "top_p": 0.9}  # and its top-p run


def generate_rate(model, prompt, tokens, chunk, repeats, **sampling):
    """Median tokens/s of model.generate(prompt, tokens, **sampling) (greedy unless a temperature
    is given) with `chunk` greedy decode steps a replay, from the first new token (the prompt's
    step) to the last, its graphs recorded beforehand."""
    model.decode_chunk = chunk
    model.generate(prompt, tokens, **sampling)
    rates = []
    for _ in range(repeats):
        times = []
        model.generate(
            prompt, tokens, callback=lambda step, ids: times.append(time.perf_counter()), **sampling
        )
        rates.append((len(times) - 1) / (times[-1] - times[0]))
    return statistics.median(rates)


def gpu_seconds(model, run, repeats):
    """Median GPU seconds of run() with the graph timed as a whole (one timestamp pair)."""
    model.timings = "total"
    model.reset_graphs()
    run()
    times = []
    for _ in range(repeats):
        run()
        times.append(model.last_step.timings()[0][1])
    model.timings = False
    model.reset_graphs()
    return statistics.median(times)


def per_op(model, run):
    model.timings = True
    model.reset_graphs()
    run()
    run()
    timings = model.last_step.timings()
    model.timings = False
    model.reset_graphs()
    return timings


class TorchBitNet:
    """The same decoder in PyTorch eager, float16 dense weights (ternary values times gamma),
    with BitNet's per-token activation fake-quantization before every projection when
    quantize_activations (as transformers' BitNetForCausalLM runs a float checkpoint)."""

    def __init__(self, torch, config, max_tokens, quantize_activations=True):
        self.torch, self.c, self.quant = torch, config, quantize_activations
        f16, dev = torch.float16, "cuda"
        gen = torch.Generator(device=dev).manual_seed(0)
        h, i, kv = config.hidden_size, config.intermediate_size, config.kv_size

        def ternary(rows, cols):
            w = torch.randint(0, 3, (rows, cols), device=dev, dtype=torch.int8, generator=gen)
            return ((w.to(f16) - 1) * (1.0 / math.sqrt(cols))).contiguous()

        ones = lambda n: torch.ones(n, device=dev, dtype=f16)  # noqa: E731
        self.layers = [
            dict(
                q=ternary(h, h),
                k=ternary(kv, h),
                v=ternary(kv, h),
                o=ternary(h, h),
                gate=ternary(i, h),
                up=ternary(i, h),
                down=ternary(h, i),
                n1=ones(h),
                n2=ones(h),
                sa=ones(h),
                sf=ones(i),
            )
            for _ in range(config.num_hidden_layers)
        ]
        self.embed = torch.randn(config.vocab_size, h, device=dev, dtype=f16, generator=gen)
        self.norm = ones(h)
        shape = (config.num_hidden_layers, max_tokens, config.num_key_value_heads, config.head_dim)
        self.kc = torch.zeros(shape, device=dev, dtype=f16)
        self.vc = torch.zeros(shape, device=dev, dtype=f16)
        cos, sin = bg.rope_tables(np.arange(max_tokens), config.head_dim, config.rope_theta)
        self.cos = torch.tensor(cos, device=dev).to(f16)
        self.sin = torch.tensor(sin, device=dev).to(f16)
        self.nbytes = (
            sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values())
            + self.embed.numel() * 2
        )

    def rms(self, x, w):
        x32 = x.float()
        return (x32 * self.torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.c.rms_norm_eps)).to(
            x.dtype
        ) * w

    def lin(self, x, w):
        if self.quant:
            s = 127.0 / x.abs().amax(-1, keepdim=True).clamp(min=1e-5)
            x = (x * s).round().clamp(-128, 127) / s
        return self.torch.nn.functional.linear(x, w)

    def rope(self, x, positions):
        d = x.shape[-1] // 2
        c, s = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        a, b = x[..., :d], x[..., d:]
        return self.torch.cat([a * c - b * s, a * s + b * c], dim=-1)

    def step(self, ids, start):
        torch, c = self.torch, self.c
        F = torch.nn.functional
        t = ids.shape[0]
        positions = torch.arange(start, start + t, device="cuda")
        x = self.embed[ids]
        group = c.num_attention_heads // c.num_key_value_heads
        for index, w in enumerate(self.layers):
            n = self.rms(x, w["n1"])
            q = self.rope(self.lin(n, w["q"]).view(t, c.num_attention_heads, c.head_dim), positions)
            k = self.rope(self.lin(n, w["k"]).view(t, c.num_key_value_heads, c.head_dim), positions)
            v = self.lin(n, w["v"]).view(t, c.num_key_value_heads, c.head_dim)
            self.kc[index, start : start + t] = k
            self.vc[index, start : start + t] = v
            keys = self.kc[index, : start + t].transpose(0, 1).repeat_interleave(group, 0)
            values = self.vc[index, : start + t].transpose(0, 1).repeat_interleave(group, 0)
            a = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], keys[None], values[None], is_causal=t > 1
            )
            a = self.rms(a[0].transpose(0, 1).reshape(t, c.hidden_size), w["sa"])
            x = x + self.lin(a, w["o"])
            m = self.rms(x, w["n2"])
            f = self.rms(
                torch.relu(self.lin(m, w["gate"])).square() * self.lin(m, w["up"]), w["sf"]
            )
            x = x + self.lin(f, w["down"])
        logits = F.linear(self.rms(x[-1:], self.norm), self.embed)
        return logits.argmax(-1)


def main():
    args = arguments(
        __doc__,
        lambda p: (
            p.add_argument("--config", default="2b4t"),
            p.add_argument("--contexts", default="128,2048"),
            p.add_argument("--prefill", type=int, default=512),
            p.add_argument("--steps", type=int, default=30),
            p.add_argument(
                "--generate",
                type=int,
                default=256,
                help="new tokens of the generate rows (0: none)",
            ),
            p.add_argument(
                "--batches",
                default="1,8,16,32,64",
                help="batch sizes of the generate_batch rows ('': none)",
            ),
            p.add_argument(
                "--verify", default="2,4,8", help="tokens of the verify rows ('': none)"
            ),
            p.add_argument(
                "--max-tokens", type=int, default=None, help="KV cache a sequence (the config's)"
            ),
            p.add_argument(
                "--no-anchor", action="store_true", help="no bf16 batched anchor beside batches"
            ),
            p.add_argument(
                "--speculative", default="2,4,8", help="k of the speculative rows ('': none)"
            ),
            p.add_argument("--kv-cache-dtype", default="float32", choices=["float32", "float16"]),
            p.add_argument(
                "--batch-prompt", type=int, default=192, help="prompt tokens of the batch rows"
            ),
        ),
    )
    if args.tiny:
        args.config, args.contexts, args.prefill, args.steps = "tiny", "8", 16, 2
        args.generate, args.batches, args.repeats, args.max_tokens = 8, "1,2", 2, 320
        args.speculative = "4"
    contexts = [int(c) for c in args.contexts.split(",")]
    config = BitNetConfig.preset(args.config)
    device = bg.default_device()
    torch = torch_cuda()
    results = {
        "device": device.name,
        "config": args.config,
        "kv_cache_dtype": args.kv_cache_dtype,
        "rows": [],
    }
    copy_gbps = torch_copy_gbps(torch, args.repeats) if torch else None
    results["copy_gbps"] = copy_gbps

    # A sequence's cache holds max_tokens (the config's 4096 unless told): what a batch row's
    # memory a sequence counts.
    max_tokens = args.max_tokens or max(
        config.max_position_embeddings, *contexts, args.prefill, GENERATE_PROMPT + args.generate + 8
    )
    before = device.memory_stats()["in_use_bytes"]
    start = time.perf_counter()
    model = BitNetModel.random(
        config, seed=0, max_tokens=max_tokens, kv_cache_dtype=args.kv_cache_dtype
    )
    results["load_seconds"] = time.perf_counter() - start
    fill = fill_cache(model, max(contexts))
    model.reset_graphs()
    results["weights_bytes"] = model.nbytes
    results["projection_bytes"] = model.projection_nbytes
    results["head_bytes"] = model.lm_head.nbytes
    results["kv_cache_bytes"] = model.cache_nbytes
    step_bytes = model.projection_nbytes + model.lm_head.nbytes
    print(
        f"device {device.name}; config {args.config}: weights {model.nbytes / 1e9:.3f} GB "
        f"(packed projections {model.projection_nbytes / 1e9:.3f} GB, float16 head "
        f"{model.lm_head.nbytes / 1e9:.3f} GB), KV cache {model.cache_nbytes / 1e9:.3f} GB"
    )
    if copy_gbps:
        print(
            f"copy bandwidth {copy_gbps:.0f} GB/s: limit "
            f"{model.projection_nbytes / copy_gbps / 1e3:.0f} us/token "
            f"for the packed projections, {step_bytes / copy_gbps / 1e3:.0f} us with the head"
        )

    start = time.perf_counter()
    decode_step(model, contexts[0])()
    results["first_decode_step_seconds"] = (
        time.perf_counter() - start
    )  # with the screening copy built
    results["screening_bytes"] = model.screening_nbytes
    results["decode_memory_in_use_bytes"] = device.memory_stats()["in_use_bytes"] - before
    if model.screened_head:
        print(
            f"head screening copy {model.screening_nbytes / 1e9:.3f} GB, built with the first "
            f"decode step "
            f"({results['first_decode_step_seconds']:.1f} s)"
        )
    peer = TorchBitNet(torch, config, max_tokens) if torch else None
    if peer:
        peer.step(torch.tensor(fill[0], device="cuda"), 0)
    for context in contexts:
        step = decode_step(model, context)
        step()
        # The GPU's clocks, power and temperature while the step is timed, so a throttled run
        # shows (None on devices whose platform reports nothing).
        sampler = TelemetrySampler(model.device, 0.01)
        sampler.start()
        wall = median_wall(step, args.steps)
        gpu = gpu_seconds(model, step, args.steps)
        state = telemetry_summary(sampler.stop())
        ops = split(per_op(model, step))
        row = {
            "phase": "decode",
            "context": context,
            "wall_s": wall,
            "gpu_s": gpu,
            "tokens_per_s": 1 / wall,
            "split_s": ops,
            "screened_head": model.screened_head,
            "telemetry": state,
        }
        if model.screened_head:  # the same step with the float16 head and argmax_rows
            model.screened_head = False
            step()
            row["float_head_wall_s"] = median_wall(step, args.steps)
            row["float_head_gpu_s"] = gpu_seconds(model, step, args.steps)
            row["float_head_split_s"] = split(per_op(model, step))
            model.screened_head = True
            model.reset_graphs()
            step()
        if copy_gbps:
            limit = model.projection_nbytes / (copy_gbps * 1e9)
            row.update(
                limit_s=limit,
                limit_with_head_s=step_bytes / (copy_gbps * 1e9),
                gpu_over_limit=gpu / limit,
                wall_over_limit=wall / limit,
            )
        if peer:
            ids = torch.tensor([17], device="cuda")
            torch_step = lambda: peer.step(ids, context).item()  # noqa: E731
            torch_step()
            row["torch_wall_s"] = median_wall(torch_step, args.steps)
            row["speedup_vs_torch"] = row["torch_wall_s"] / wall
            peer.quant = False
            row["torch_plain_wall_s"] = median_wall(torch_step, args.steps)
            row["speedup_vs_torch_plain"] = row["torch_plain_wall_s"] / wall
            peer.quant = True
        results["rows"].append(row)
        print(
            f"decode, context {context}: {1 / wall:.0f} tokens/s ({wall * 1e6:.0f} us wall, "
            f"{gpu * 1e6:.0f} us GPU)"
            + (
                f"; {row['gpu_over_limit']:.2f}x the limit (GPU), "
                f"{row['wall_over_limit']:.2f}x (wall)"
                if copy_gbps
                else ""
            )
            + (
                f"; PyTorch eager float16 {row['torch_wall_s'] * 1e6:.0f} us "
                f"({row['speedup_vs_torch']:.2f}x), without activation quant "
                f"{row['torch_plain_wall_s'] * 1e6:.0f} us ({row['speedup_vs_torch_plain']:.2f}x)"
                if peer
                else ""
            )
        )
        if state["source"]:
            print(
                f"    while timed ({state['samples']} readings, median / max): "
                f"{describe_state(state)}"
            )
        total = sum(ops.values())
        for kind, seconds in ops.items():
            print(f"    {kind:40s} {seconds * 1e6:9.1f} us  {100 * seconds / total:5.1f}%")
        if "float_head_gpu_s" in row:
            print(
                f"    with the float16 head instead: {1 / row['float_head_wall_s']:.0f} tokens/s "
                f"({row['float_head_wall_s'] * 1e6:.0f} us wall, "
                f"{row['float_head_gpu_s'] * 1e6:.0f} us GPU; head "
                f"{row['float_head_split_s'].get('LM head (float16)', 0) * 1e6:.1f} us, argmax "
                f"{row['float_head_split_s'].get('argmax', 0) * 1e6:.1f} us per op)"
            )

    if args.generate:
        prompt = fill[0, :GENERATE_PROMPT]
        chunk = model.decode_chunk
        repeats = max(3, args.repeats // 4)
        rates = {c: generate_rate(model, prompt, args.generate, c, repeats) for c in (chunk, 1)}
        sampled = {
            c: generate_rate(model, prompt, args.generate, c, repeats, **SAMPLING)
            for c in (chunk, 1)
        }
        nucleus = (
            {
                c: generate_rate(model, prompt, args.generate, c, repeats, **NUCLEUS)
                for c in (chunk, 1)
            }
            if model.device.info.features["int64_atomics"]
            else None
        )
        model.decode_chunk = chunk
        row = {
            "phase": "generate",
            "prompt": GENERATE_PROMPT,
            "tokens": args.generate,
            "decode_chunk": chunk,
            "tokens_per_s": rates[chunk],
            "one_step_a_replay_tokens_per_s": rates[1],
            "sampling": SAMPLING,
            "sampled_tokens_per_s": sampled[chunk],
            "sampled_one_step_a_replay_tokens_per_s": sampled[1],
        }
        if nucleus:
            row.update(
                {
                    "nucleus_sampling": NUCLEUS,
                    "nucleus_tokens_per_s": nucleus[chunk],
                    "nucleus_one_step_a_replay_tokens_per_s": nucleus[1],
                }
            )
        results["rows"].append(row)
        print(
            f"generate {args.generate} tokens after {GENERATE_PROMPT} (greedy): "
            f"{rates[chunk]:.0f} tokens/s with "
            f"{chunk} steps a replay, {rates[1]:.0f} with one ({rates[chunk] / rates[1]:.3f}x); "
            f"sampled "
            f"({SAMPLING}, drawn on the GPU): {sampled[chunk]:.0f} tokens/s with {chunk} steps a "
            f"replay, "
            f"{sampled[1]:.0f} with one"
            + (
                f"; with top-p {NUCLEUS['top_p']} too: {nucleus[chunk]:.0f} / {nucleus[1]:.0f}"
                if nucleus
                else ""
            )
        )

    if args.batches:
        batches = [int(b) for b in args.batches.split(",") if b]
        results["rows"] += batch_rows(
            model, batches, args.generate or BATCH_NEW, max(2, args.repeats // 4), args.steps,
            None if args.no_anchor else torch, sys.modules[__name__], args.batch_prompt,
        )  # fmt: skip
    if args.verify:
        counts = [int(t) for t in args.verify.split(",") if t]
        results["rows"] += verify_rows(model, counts, args.steps, sys.modules[__name__])
    if args.speculative:
        counts = [int(k) for k in args.speculative.split(",") if k]
        results["rows"] += speculative_rows(
            model,
            counts,
            max(2, args.repeats // 4),
            sys.modules[__name__],
            24 if args.tiny else 128,
        )

    if args.prefill:
        prompt = (
            np.random.default_rng(1)
            .integers(0, config.vocab_size, (1, args.prefill))
            .astype(np.int32)
        )

        def prefill():
            return replay(model, prompt, 0, Pick.LAST_LOGITS).logits()

        prefill()
        wall = median_wall(prefill, max(3, args.repeats // 2))
        gpu = gpu_seconds(model, prefill, 3)
        ops = split(per_op(model, prefill))
        row = {
            "phase": "prefill",
            "tokens": args.prefill,
            "wall_s": wall,
            "gpu_s": gpu,
            "tokens_per_s": args.prefill / wall,
            "split_s": ops,
        }
        if peer:
            ids = torch.tensor(prompt[0], device="cuda")
            torch_prefill = lambda: peer.step(ids, 0).item()  # noqa: E731
            torch_prefill()
            row["torch_wall_s"] = median_wall(torch_prefill, max(3, args.repeats // 2))
            row["speedup_vs_torch"] = row["torch_wall_s"] / wall
        if device.info.features.get("cooperative_matrix_khr_float16"):
            model.prefill_attention = "float16"
            prefill()
            row["float16_attention"] = {
                "wall_s": median_wall(prefill, max(3, args.repeats // 2)),
                "gpu_s": gpu_seconds(model, prefill, 3),
                "split_s": split(per_op(model, prefill)),
            }
            model.prefill_attention = "float32"
        results["rows"].append(row)
        print(
            f"prefill {args.prefill} tokens: {args.prefill / wall:.0f} tokens/s ({wall * 1e3:.2f} "
            f"ms wall, "
            f"{gpu * 1e3:.2f} ms GPU)"
            + (
                f"; PyTorch eager float16 {row['torch_wall_s'] * 1e3:.2f} ms "
                f"({row['speedup_vs_torch']:.2f}x)"
                if peer
                else ""
            )
        )
        total = sum(ops.values())
        for kind, seconds in ops.items():
            print(f"    {kind:40s} {seconds * 1e6:9.1f} us  {100 * seconds / total:5.1f}%")
        if "float16_attention" in row:
            half = row["float16_attention"]
            print(
                f"  with prefill_attention='float16': {half['wall_s'] * 1e3:.2f} ms wall, "
                f"{half['gpu_s'] * 1e3:.2f} ms GPU, attention "
                f"{half['split_s'].get('attention', float('nan')) * 1e6:.1f} us"
            )

    stats = device.memory_stats()
    results["device_memory_in_use_bytes"] = stats["in_use_bytes"] - before
    print(
        f"GPU memory in use by bitnet_gpu: {results['decode_memory_in_use_bytes'] / 1e9:.3f} GB "
        f"while "
        f"decoding (weights, KV cache, one decode graph); "
        f"{results['device_memory_in_use_bytes'] / 1e9:.3f} GB "
        f"with the prefill graph"
        + (f"; PyTorch float16 weights {peer.nbytes / 1e9:.3f} GB" if peer else "")
    )
    if peer:
        results["torch_weights_bytes"] = peer.nbytes
    write_results(args.json, results)


if __name__ == "__main__":
    main()

"""Command line: ``python -m bitnet_gpu info`` lists devices; ``python -m bitnet_gpu demo``
quantizes a layer, runs BitLinear and a small decoder generating text, each against NumPy;
``python -m bitnet_gpu generate --config 2b4t --random-weights --tokens 64`` generates tokens with
the BitNet decoder (``--weights DIR --prompt "text"`` streams a checkpoint's reply as text) and
reports tokens/s; ``python -m bitnet_gpu chat --weights DIR`` is an interactive chat."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu import reference


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _telemetry_line(reading: dict) -> str:
    """A telemetry reading as one line, the fields the platform gave."""
    parts = []
    for field, unit in [
        ("temperature_c", " C"),
        ("power_w", " W"),
        ("power_limit_w", " W limit"),
        ("sm_clock_mhz", " MHz SM"),
        ("memory_clock_mhz", " MHz memory"),
    ]:
        if reading.get(field) is not None:
            parts.append(f"{reading[field]:.0f}{unit}")
    if reading.get("utilization") is not None:
        parts.append(f"{100 * reading['utilization']:.0f}% busy")
    if reading.get("throttle_reasons"):
        parts.append("throttled: " + ", ".join(reading["throttle_reasons"]))
    return ", ".join(parts) or "nothing reported"


def info(_args) -> int:
    chosen = bg.default_device().info.index
    for d in bg.devices():
        mark = "*" if d.index == chosen else " "
        print(f"{mark} device {d.index}: {d.name}")
        print(
            f"    type {d.type}, vendor 0x{d.vendor_id:04x}, Vulkan {d.vulkan_version}, "
            f"driver {d.driver_name} ({d.driver_info})"
        )
        heaps = ", ".join(
            f"{_size(h['size'])}{' device-local' if h['device_local'] else ''}"
            for h in d.memory_heaps
        )
        print(f"    memory heaps: {heaps}")
        print(
            f"    subgroup {d.subgroup_size}, workgroup <= {d.max_workgroup_invocations} "
            f"invocations, shared memory {_size(d.max_shared_memory)}, "
            f"storage buffer range {_size(d.max_storage_buffer_range)}, "
            f"allocation <= {_size(d.max_allocation_size)}"
            + (f", {d.multiprocessors} multiprocessors" if d.multiprocessors else "")
        )
        features = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in sorted(d.features.items()))
        print(f"    features: {features}")
        if d.uuid or d.pci_address:
            print(f"    uuid {d.uuid}" + (f", PCI {d.pci_address}" if d.pci_address else ""))
        if d.index == chosen:
            device = bg.default_device()
            reading = device.telemetry()
            if reading["source"]:
                print(f"    now ({reading['source']}): {_telemetry_line(reading)}")
            heaps = device.memory_stats()["heaps"]
            if any(h["budget"] is not None for h in heaps):
                print(
                    "    heap budgets: "
                    + ", ".join(f"{_size(h['usage'])} used of {_size(h['budget'])}" for h in heaps)
                )
    print("(* = the device bitnet_gpu uses by default; BITNET_GPU_DEVICE=<index|name> changes it)")
    return 0


DEMO_CORPUS = [
    "BitNet b1.58 keeps every weight in three values and every activation in eight bits.",
    "The ternary matrix multiplies int8 activations exactly; a scale per tensor does the rest.",
    "Vulkan runs it on any GPU, and on the CPU where there is none.",
]


def _demo_tokenizer():
    """A byte-level BPE tokenizer trained here on a few sentences (the tokenizers library), as a
    checkpoint's tokenizer.json would be read."""
    import tempfile

    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from bitnet_gpu.text import Tokenizer

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|eot_id|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(DEMO_CORPUS * 10, trainer)
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/tokenizer.json"
        tok.save(path)
        return Tokenizer(path)


def demo(_args) -> int:
    """BitNet on this device, each step against NumPy: a layer quantized to ternary weights, a
    BitLinear with exact integer accumulators, and a small decoder generating text."""
    from bitnet_gpu.models import BitNetConfig, BitNetModel

    device = bg.default_device()
    print(f"device: {device.name} ({device.info.type}, Vulkan {device.info.vulkan_version})")
    rng = np.random.default_rng()
    ok = True

    def report(name: str, good: bool, detail: str, seconds: float) -> None:
        nonlocal ok
        ok &= good
        print(f"  {'PASS' if good else 'FAIL'}  {name}: {detail} ({seconds * 1e3:.0f} ms)")

    w = rng.standard_normal((6912, 2560)).astype(np.float32)
    start = time.perf_counter()
    q = bg.quantize_weights(w, device=device)
    values, gamma = q.unpack(), q.scale
    seconds = time.perf_counter() - start
    # gamma sums |W| in another order than NumPy (NUMERICS.md: 1e-5); the values follow from it,
    # a value that lands on a rounding tie (|W| / gamma = 0.5 within float32) either way.
    ref_gamma = float(reference.weight_scale(w)[0])
    ref_values, _ = reference.quantize_ternary(w, gamma=gamma)
    differ = values != ref_values
    ties = np.abs(np.abs(w.astype(np.float64) / float(gamma)) - 0.5) <= 1e-6
    report(
        "a 2560 -> 6912 layer quantized to ternary weights on the GPU",
        abs(gamma - ref_gamma) <= 1e-5 * abs(ref_gamma) and not np.any(differ & ~ties),
        f"{w.size} weights, {q.nbytes / 2**20:.1f} MiB packed, every value NumPy's"
        + (f" but {int(differ.sum())} on rounding ties" if differ.any() else ""),
        seconds,
    )

    x = rng.standard_normal((8, 2560)).astype(np.float32)
    start = time.perf_counter()
    y, acc = bg.bitlinear(x, q, return_accumulator=True)
    seconds = time.perf_counter() - start
    y_ref, acc_ref = reference.bitlinear(x, values, gamma)
    error = float(np.linalg.norm(y - y_ref) / np.linalg.norm(y_ref))
    report(
        "BitLinear, 8 int8 rows x ternary weights",
        np.array_equal(acc, acc_ref) and error <= 1e-6,
        f"int32 accumulators exact, y within {error:.1e} of NumPy's",
        seconds,
    )

    try:
        tokenizer = _demo_tokenizer()
    except ImportError:
        print('  SKIP  text generation: pip install "bitnet_gpu[text]" for tokenizers and jinja2')
        tokenizer = None
    if tokenizer is not None:
        config = BitNetConfig.preset("tiny", vocab_size=tokenizer.vocab_size)
        start = time.perf_counter()
        model = BitNetModel.random(config, seed=int(rng.integers(1 << 31)), max_tokens=64)
        model.tokenizer = tokenizer
        prompt = "BitNet runs on"
        ids = np.array(tokenizer.encode(prompt), np.int64)
        logits = model.forward(ids[None])[0]
        expected, ties = reference.bitnet_forward(
            model.reference_params(), config, ids[None], return_ties=True
        )
        # Past an int8 rounding tie a token's logits and the later ones may move (NUMERICS.md).
        clean, error, whole = reference.logits_agreement(logits, expected[0], ties[0])
        text = model.generate_text(prompt, 24)
        seconds = time.perf_counter() - start
        report(
            "a small BitNet decoder built here, generating text through a BPE tokenizer",
            error <= 1e-4 and whole <= 5e-2,
            f"{config.num_hidden_layers} layers, "
            + (
                f"prompt logits within {error:.1e} of NumPy's"
                if clean == len(ids)
                else f"prompt logits within {error:.1e} of NumPy's over the {clean} token"
                f"{'s' * (clean != 1)} before an int8 rounding tie, {whole:.1e} in all"
                if clean
                else f"prompt logits within {whole:.1e} of NumPy's (an int8 rounding tie at the "
                "first token)"
            )
            + f"; random weights wrote {text[:40]!r}",
            seconds,
        )
    print("demo passed" if ok else "demo FAILED")
    return 0 if ok else 1


def generate(args) -> int:
    from bitnet_gpu.models import BitNetConfig, BitNetModel

    if bool(args.weights) == bool(args.random_weights):
        print("generate: pass exactly one of --weights FILE and --random-weights", file=sys.stderr)
        return 2
    config = BitNetConfig.preset(args.config) if args.config else None
    max_tokens = args.max_tokens
    start = time.perf_counter()
    try:
        if args.random_weights:
            model = BitNetModel.random(
                config or BitNetConfig.preset("tiny"), seed=args.seed, max_tokens=max_tokens
            )
        else:
            model = BitNetModel.from_weights(args.weights, config, max_tokens=max_tokens)
        model.prepare_screened_head()  # before the first token's clock starts
    except (bg.Error, OSError) as e:
        print(f"generate: {e}", file=sys.stderr)
        return 2
    loaded = model.load_summary or (
        f"model: {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
        f"{_size(model.nbytes + model.screening_nbytes)} on {model.device.name}; made in "
        f"{time.perf_counter() - start:.1f} s"
    )
    if args.prompt is not None:
        print(loaded, file=sys.stderr)
        return _generate_text(model, args)
    print(loaded)
    if args.prompt_ids is not None:
        prompt = np.array(args.prompt_ids, np.int64)
    else:
        prompt = np.random.default_rng(args.seed).integers(
            0, model.config.vocab_size, args.prompt_tokens
        )
    tokens = []
    times = []
    begin = time.perf_counter()
    width = 30

    def progress(step, ids):
        times.append(time.perf_counter())
        tokens.append(int(ids[0]))
        done = step + 1
        filled = width * done // args.tokens
        rate = (done - 1) / (times[-1] - times[0]) if done > 1 else 0.0
        print(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{args.tokens} tokens, "
            f"{rate:.1f} tokens/s",
            end="",
            flush=True,
        )

    try:
        model.generate(
            prompt,
            args.tokens,
            temperature=args.temperature or 0.0,
            top_k=args.top_k,
            seed=args.seed,
            callback=progress,
            top_p=args.top_p,
        )
    except (
        bg.Error
    ) as e:  # a bad setting (tokens, temperature, top-k, top-p, prompt ids): no traceback
        print(f"{chr(10) if times else ''}generate: {e}", file=sys.stderr)
        return 2
    print()
    first = times[0] - begin if times else float("nan")
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    # The first decode replay records the decode graph (its kernels built on first use): the rate
    # after it is what later steps run at. Decoding runs up to model.decode_chunk steps a replay
    # (model._chunk), whose tokens arrive together.
    chunk = model._chunk(len(prompt), len(times) - 1) if len(times) > 1 else 1
    later = (
        (len(times) - 1 - chunk) / (times[-1] - times[chunk])
        if len(times) > chunk + 1
        else float("nan")
    )
    what = "step" if chunk == 1 else f"{chunk} steps"
    print(
        f"prompt {len(prompt)} tokens: first token after {first * 1e3:.1f} ms; "
        f"decode {decode:.1f} tokens/s ({len(times)} tokens)"
        + (
            f"; the first decode replay ({what}) {(times[chunk] - times[0]) * 1e3:.1f} ms "
            f"(recording its "
            f"graph), {later:.1f} tokens/s after it"
            if len(times) > chunk + 1
            else ""
        )
    )
    print("token ids:", " ".join(str(t) for t in tokens))
    return 0


def _generate_text(model, args) -> int:
    """--prompt TEXT: the reply streamed to stdout as text as it arrives, tokens/s on stderr."""
    times: list[float] = []
    try:
        prompt_tokens = len(model._text_prompt(args.prompt))
        begin = time.perf_counter()
        for piece in model.stream_text(
            args.prompt,
            args.tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            callback=lambda step, token: times.append(time.perf_counter()),
        ):
            print(piece, end="", flush=True)
    except (bg.Error, ImportError, TypeError) as e:
        print(f"generate: {e}", file=sys.stderr)
        return 2
    print()
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    first = (times[0] - begin) * 1e3 if times else float("nan")
    print(
        f"prompt {prompt_tokens} tokens: first token after {first:.1f} ms; {len(times)} tokens, "
        f"{rate:.1f} tokens/s",
        file=sys.stderr,
    )
    return 0


def chat(args) -> int:
    """An interactive chat: each line read is a user turn, the reply streams back; the
    conversation and its KV cache stay between turns (only each new turn's tokens are fed)."""
    from bitnet_gpu.models import BitNetModel

    try:
        model = BitNetModel.from_pretrained(args.weights, max_tokens=args.max_tokens)
        if model.tokenizer is None or not model.tokenizer.chat_template:
            raise bg.ArgumentError(f"{args.weights}: a chat needs tokenizer.json and a template")
        model.prepare_screened_head()
    except (bg.Error, OSError, ImportError) as e:
        print(f"chat: {e}", file=sys.stderr)
        return 2
    print(model.load_summary, file=sys.stderr)
    print("an empty line or end of input ends the chat; /reset starts a new one", file=sys.stderr)
    session = model.session()
    messages = [{"role": "system", "content": args.system}] if args.system else []
    start = list(messages)
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        if not line.strip():
            break
        if line.strip() == "/reset":
            messages = list(start)
            session.reset()
            continue
        messages.append({"role": "user", "content": line})
        times: list[float] = []
        reply = []
        try:
            for piece in model.stream_text(
                messages,
                args.tokens,
                temperature=args.temperature,
                top_k=args.top_k,
                top_p=args.top_p,
                seed=args.seed + len(messages),
                callback=lambda step, token: times.append(time.perf_counter()),
                session=session,
            ):
                reply.append(piece)
                print(piece, end="", flush=True)
        except bg.Error as e:  # the conversation outgrew the cache, a bad setting
            print(f"\nchat: {e}", file=sys.stderr)
            messages.pop()
            continue
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
        rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
        print(
            f"[{len(times)} tokens, {rate:.1f} tokens/s; {int(session.lengths[0])} in the "
            "conversation]",
            file=sys.stderr,
        )
    return 0


def _token_ids(text: str) -> list[int]:
    """--prompt: comma-separated token ids."""
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids, got {text!r}"
        ) from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bitnet_gpu", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="list Vulkan devices and their capabilities")
    sub.add_parser("demo", help="BitNet on this device, each step checked against NumPy")
    gen = sub.add_parser("generate", help="generate tokens with the BitNet b1.58 decoder")
    gen.add_argument(
        "--config",
        choices=["tiny", "2b4t"],
        help="model preset (default: from the "
        "checkpoint's config.json, or tiny with --random-weights)",
    )
    gen.add_argument("--weights", help="a safetensors file, or a checkpoint directory")
    gen.add_argument("--random-weights", action="store_true", help="random ternary weights")
    gen.add_argument("--tokens", type=int, default=64, help="new tokens to generate")
    prompt = gen.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt", help="prompt text (the checkpoint's tokenizer): the reply is streamed as text"
    )
    prompt.add_argument("--prompt-ids", type=_token_ids, help="comma-separated prompt token ids")
    gen.add_argument(
        "--prompt-tokens", type=int, default=8, help="random prompt length without a prompt"
    )
    gen.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0: greedy (default, or generation_config.json's with --prompt)",
    )
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="nucleus sampling: keep the most likely "
        "tokens holding this share of the probability (0 < p <= 1)",
    )
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--max-tokens", type=int, default=None, help="KV cache length")
    talk = sub.add_parser("chat", help="chat with a checkpoint, its KV cache kept between turns")
    talk.add_argument("--weights", required=True, help="a checkpoint directory")
    talk.add_argument("--system", help="a system message opening the conversation")
    talk.add_argument("--tokens", type=int, default=256, help="most new tokens a reply")
    talk.add_argument(
        "--temperature", type=float, default=None, help="default: generation_config.json's"
    )
    talk.add_argument("--top-k", type=int, default=None)
    talk.add_argument("--top-p", type=float, default=None)
    talk.add_argument("--seed", type=int, default=0)
    talk.add_argument("--max-tokens", type=int, default=None, help="KV cache length")
    args = parser.parse_args(argv)
    handlers = {"info": info, "demo": demo, "generate": generate, "chat": chat}
    return handlers[args.command or "info"](args)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bitnet_gpu generate`` and ``chat``: the decoder from the command line, its
options those of GenerationOptions (the one signature the model's methods share)."""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

import bitnet_gpu as bg
from bitnet_gpu.cli_devices import size_text
from bitnet_gpu.models.generation import GenerationOptions
from bitnet_gpu.models.text_generation import prompt_ids


def add_kv_cache_dtype(parser) -> None:
    """--kv-cache-dtype, as generate, chat and serve take it (BitNetModel's kv_cache_dtype)."""
    parser.add_argument(
        "--kv-cache-dtype",
        choices=["float32", "float16"],
        default="float32",
        help="the KV cache's dtype (float16: half the memory a sequence)",
    )


def options(args, **changes) -> GenerationOptions:
    """The command line's generation options (--tokens, --temperature, --top-k, --top-p, --seed,
    --prompt-lookup) as GenerationOptions, with `changes` on top."""
    chosen = GenerationOptions(
        args.tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        prompt_lookup_num_tokens=args.prompt_lookup,
    )
    return dataclasses.replace(chosen, **changes)


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
                config or BitNetConfig.preset("tiny"),
                seed=args.seed,
                max_tokens=max_tokens,
                kv_cache_dtype=args.kv_cache_dtype,
            )
        else:
            model = BitNetModel.from_weights(
                args.weights, config, max_tokens=max_tokens, kv_cache_dtype=args.kv_cache_dtype
            )
        model.prepare_screened_head()  # before the first token's clock starts
    except (bg.Error, OSError) as e:
        print(f"generate: {e}", file=sys.stderr)
        return 2
    loaded = model.load_summary or (
        f"model: {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
        f"{size_text(model.nbytes + model.screening_nbytes)} on {model.device.name}; made in "
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
        model.generate(prompt, **vars(options(args, callback=progress)))
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
    # (model.policy.chain), whose tokens arrive together.
    chunk = model.policy.chain(len(prompt), len(times) - 1) if len(times) > 1 else 1
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
        prompt_tokens = len(prompt_ids(model, args.prompt))
        begin = time.perf_counter()
        chosen = options(args, callback=lambda step, token: times.append(time.perf_counter()))
        for piece in model.stream_text(args.prompt, **vars(chosen)):
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
        model = BitNetModel.from_pretrained(
            args.weights, max_tokens=args.max_tokens, kv_cache_dtype=args.kv_cache_dtype
        )
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
            turn = options(
                args,
                seed=args.seed + len(messages),
                callback=lambda step, token: times.append(time.perf_counter()),
                session=session,
            )
            for piece in model.stream_text(messages, **vars(turn)):
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

"""Command line: ``python -m bitnet_gpu info`` lists devices; ``python -m bitnet_gpu demo``
quantizes a layer, runs BitLinear and a small decoder generating text, each against NumPy;
``python -m bitnet_gpu generate --config 2b4t --random-weights --tokens 64`` generates tokens with
the BitNet decoder (``--weights DIR --prompt "text"`` streams a checkpoint's reply as text) and
reports tokens/s; ``python -m bitnet_gpu chat --weights DIR`` is an interactive chat;
``python -m bitnet_gpu serve --weights DIR`` an OpenAI-compatible server."""

from __future__ import annotations

import argparse
import sys

from bitnet_gpu.cli_devices import demo, info
from bitnet_gpu.cli_generate import add_kv_cache_dtype, chat, generate
from bitnet_gpu.cli_serve import add_parser as add_serve_parser, serve


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
    gen.add_argument(
        "--prompt-lookup",
        type=int,
        default=None,
        metavar="K",
        help="speculative decoding: up to K ids drafted a round by prompt lookup (the same ids)",
    )
    gen.add_argument("--max-tokens", type=int, default=None, help="KV cache length")
    add_kv_cache_dtype(gen)
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
    talk.add_argument("--prompt-lookup", type=int, default=None, metavar="K", help="as generate's")
    talk.add_argument("--max-tokens", type=int, default=None, help="KV cache length")
    add_kv_cache_dtype(talk)
    add_serve_parser(sub)
    args = parser.parse_args(argv)
    handlers = {"info": info, "demo": demo, "generate": generate, "chat": chat, "serve": serve}
    return handlers[args.command or "info"](args)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bitnet_gpu serve``: the OpenAI-compatible server (bitnet_gpu.serving) over a
checkpoint, or over random weights with a tokenizer given apart (benchmarks)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

import bitnet_gpu as bg
from bitnet_gpu.cli_generate import add_kv_cache_dtype

_log = logging.getLogger("bitnet_gpu")


def add_parser(sub) -> None:
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (pip install .[serve])")
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", help="a checkpoint directory")
    source.add_argument(
        "--random-weights",
        choices=["tiny", "2b4t"],
        help="random weights of this preset (benchmarks; needs --tokenizer)",
    )
    serve.add_argument(
        "--tokenizer", help="a directory with tokenizer.json, instead of the model's"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-batch", type=int, default=64, help="sequences decoded a step")
    serve.add_argument("--max-queue", type=int, default=256, help="requests waiting, then 429")
    serve.add_argument("--device", type=int, default=None, help="Vulkan device index")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    serve.add_argument("--served-model-name", default=None, help="the model's name in the API")
    serve.add_argument("--max-tokens", type=int, default=None, help="context a request may fill")
    add_kv_cache_dtype(serve)
    serve.add_argument(
        "--prefill-chunk", type=int, default=None, help="prompt tokens fed between decode steps"
    )
    serve.add_argument(
        "--warm-prompt-tokens",
        type=int,
        nargs="*",
        default=[],
        metavar="N",
        help="prompt lengths whose prefill graphs are recorded at start-up",
    )


def serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from bitnet_gpu.serving.api import create_app
        from bitnet_gpu.serving.engine import Engine
        from bitnet_gpu.serving.metrics import Metrics
    except ImportError as error:
        print(f"serve: {error.name} is missing: pip install '.[serve]'", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    begin = time.perf_counter()
    try:
        model = _model(args)
        if args.prefill_chunk is not None:
            model.policy = _with_chunk(model.policy, args.prefill_chunk)
        engine = Engine(model, args.max_batch, args.max_queue)
        metrics = Metrics(args.max_batch)
        engine.on_step = metrics.observe_step
        engine.warm_up(args.warm_prompt_tokens)
    except (bg.Error, OSError) as error:
        print(f"serve: {error}", file=sys.stderr)
        return 2
    name = args.served_model_name or args.weights or f"random-{args.random_weights}"
    _log.info(
        "serving %s on http://%s:%d/v1 (%d slots of %d tokens; ready in %.1f s)",
        name,
        args.host,
        args.port,
        args.max_batch,
        engine.context,
        time.perf_counter() - begin,
    )
    app = create_app(engine, metrics, name, args.api_key)
    # uvicorn finishes the requests in flight on SIGTERM or Ctrl-C, then raises the signal again
    # for the handler it found: ignoring it then makes that clean end exit 0.
    for caught in (signal.SIGTERM, signal.SIGINT):
        signal.signal(caught, signal.SIG_IGN)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _model(args: argparse.Namespace):
    from bitnet_gpu.models import BitNetConfig, BitNetModel
    from bitnet_gpu.text import Tokenizer

    device = bg.Device(args.device) if args.device is not None else None
    chosen = {
        "device": device,
        "max_tokens": args.max_tokens,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    if args.weights:
        model = BitNetModel.from_pretrained(args.weights, **chosen)
    else:
        model = BitNetModel.random(BitNetConfig.preset(args.random_weights), **chosen)
    if args.tokenizer:
        tokenizer = Tokenizer.from_directory(args.tokenizer)
        if tokenizer is None:
            raise bg.ArgumentError(f"--tokenizer: {args.tokenizer} holds no tokenizer.json")
        model.tokenizer = tokenizer
    if model.tokenizer is None:
        raise bg.ArgumentError("the model has no tokenizer: pass --tokenizer DIR")
    return model


def _with_chunk(policy, tokens: int):
    import dataclasses

    if tokens < 1:
        raise bg.ArgumentError(f"--prefill-chunk must be at least 1, got {tokens}")
    return dataclasses.replace(policy, prefill_chunk=tokens)

"""The server under load: `python -m bitnet_gpu serve` over random 2B4T-shaped weights, as a
process of its own, and 1, 8, 32 and 64 concurrent streaming clients (the official `openai`
client, spread over processes), each sending one completion of token-id prompt of 128 ids for
256 new tokens; beside it, offline batched `generate` of the same load in this process, in the
same run.

    python3 benchmarks/bench_serve.py [--clients 1 8 32 64] [--temperatures 0 0.8] [--json FILE]
                                      [--tiny]

Each load at each temperature (0, greedy, by default; above 0 each request is drawn at that
temperature, with the server's defaults for the rest). Rows {"clients", "temperature",
"tokens_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "offline_tokens_per_s",
"step_s", "mean_batch"}: aggregate new tokens a second from the first
request sent to the last token received; time to first token and between tokens as each client
sees them (p50, p99; each client process makes one untimed request first, so its set-up is not
counted); offline generate's tokens a second; the server's mean decode step (wall,
from /metrics) and the mean batch it ran while these clients were served.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

from common import arguments, write_results


def tokenizer_folder(folder: str, vocab: int) -> str:
    """A word-level tokenizer.json of `vocab` ids ("t0" ...): each id a piece of text of its own."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    return folder


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return {m[0]: float(m[1]) for m in re.findall(r"^(\S+) (\S+)$", text, re.MULTILINE)}


def start_server(args, preset: str, context: int, prompt_tokens: int, folder: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "bitnet_gpu", "serve", "--random-weights", preset]
    command += ["--tokenizer", folder, "--port", str(port), "--max-tokens", str(context)]
    command += ["--max-batch", str(max(args.clients)), "--max-queue", str(max(args.clients))]
    command += ["--warm-prompt-tokens", str(prompt_tokens), "--served-model-name", "bench"]
    if args.device is not None:
        command += ["--device", str(args.device)]
    process = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    begin = time.monotonic()
    while time.monotonic() - begin < 900:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                print(f"server ready in {time.monotonic() - begin:.1f} s")
                return process, url
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise SystemExit("the server did not start in 900 s")


async def _stream(client, prompt: list[int], new_tokens: int, temperature: float, start_at: float):
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    sent = time.monotonic()
    arrivals = []
    made = 0
    stream = await client.completions.create(
        model="bench",
        prompt=prompt,
        max_tokens=new_tokens,
        temperature=temperature,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.monotonic())
        if chunk.usage is not None:
            made = chunk.usage.completion_tokens
    return sent, arrivals, made


def client_process(job):
    """One process's share of the clients: [(sent, token arrival times, tokens made)]."""
    import openai

    url, prompts, new_tokens, temperature, start_at = job

    async def run():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        async with client:
            # One request before the clock starts: a client's first call sets up its connection
            # pool and request models, which is the client's cost, not the server's.
            await client.models.list()
            return await asyncio.gather(
                *[_stream(client, p, new_tokens, temperature, start_at) for p in prompts]
            )

    return asyncio.run(run())


def serve_load(
    pool, processes: int, url: str, prompts: np.ndarray, new_tokens: int, temperature: float
) -> dict[str, float]:
    """The load of `prompts` from `processes` client processes of `pool`, drawn at `temperature`."""
    before = metrics(url)
    jobs = np.array_split(np.arange(len(prompts)), min(len(prompts), processes))
    start_at = time.monotonic() + 3.0  # every process imported, connected and warmed by then
    shares = pool.map(
        client_process,
        [
            (url, [prompts[i].tolist() for i in job], new_tokens, temperature, start_at)
            for job in jobs
        ],
    )
    results = [r for share in shares for r in share]
    after = metrics(url)
    first = min(sent for sent, _, _ in results)
    last = max(arrivals[-1] for _, arrivals, _ in results)
    made = sum(m for _, _, m in results)
    ttft = np.array([arrivals[0] - sent for sent, arrivals, _ in results])
    itl = np.concatenate([np.diff(arrivals) for _, arrivals, _ in results])

    def grown(name: str) -> float:
        return after[name] - before.get(name, 0)

    steps = grown("bitnet_gpu_decode_step_seconds_count")
    step_sum = grown("bitnet_gpu_decode_step_seconds_sum")
    batch_sum = grown("bitnet_gpu_decode_batch_size_sum")
    return {
        "tokens_per_s": made / (last - first),
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "itl_p50_s": float(np.percentile(itl, 50)) if itl.size else 0.0,
        "itl_p99_s": float(np.percentile(itl, 99)) if itl.size else 0.0,
        "step_s": step_sum / max(steps, 1),
        "mean_batch": batch_sum / max(steps, 1),
        "tokens": made,
    }


def offline_rate(model, prompts: np.ndarray, new_tokens: int, temperature: float) -> float:
    """New tokens a second of model.generate over the whole load as one batch, drawn at
    `temperature` (its second run: the first records the graphs)."""
    for _ in range(2):
        begin = time.perf_counter()
        model.generate(prompts, new_tokens, eos_token_id=[], temperature=temperature)
        seconds = time.perf_counter() - begin
    return len(prompts) * new_tokens / seconds


def main() -> None:
    def extra(parser):
        parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64])
        parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
        parser.add_argument("--prompt-tokens", type=int, default=128)
        parser.add_argument("--new-tokens", type=int, default=256)
        parser.add_argument("--device", type=int, default=None)

    args = arguments(__doc__, extra)
    if args.tiny:
        args.clients, args.prompt_tokens, args.new_tokens = [1, 3], 8, 6
        args.temperatures = [0.0, 0.8]
    import bitnet_gpu as bg
    from bitnet_gpu.models import BitNetConfig, BitNetModel

    preset = "tiny" if args.tiny else "2b4t"
    config = BitNetConfig.preset(preset)
    context = args.prompt_tokens + args.new_tokens
    device = bg.Device(args.device) if args.device is not None else None
    model = BitNetModel.random(config, device=device, max_tokens=context)
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        server, url = start_server(
            args, preset, context, args.prompt_tokens, tokenizer_folder(folder, config.vocab_size)
        )
        spawn = multiprocessing.get_context("spawn")
        try:
            processes = min(8, max(args.clients))
            with spawn.Pool(processes) as pool:
                for temperature, clients in itertools.product(args.temperatures, args.clients):
                    prompts = rng.integers(0, config.vocab_size, (clients, args.prompt_tokens))
                    row = {"clients": clients, "temperature": temperature}
                    row.update(
                        serve_load(pool, processes, url, prompts, args.new_tokens, temperature)
                    )
                    row["offline_tokens_per_s"] = offline_rate(
                        model, prompts, args.new_tokens, temperature
                    )
                    row["serve_over_offline"] = row["tokens_per_s"] / row["offline_tokens_per_s"]
                    row["itl_p99_over_step"] = row["itl_p99_s"] / max(row["step_s"], 1e-12)
                    rows.append(row)
                    print(
                        f"{clients:3d} clients at temperature {temperature:g}: "
                        f"{row['tokens_per_s']:8.1f} tok/s "
                        f"(offline {row['offline_tokens_per_s']:8.1f}, "
                        f"{row['serve_over_offline']:.2f}x), TTFT p50 "
                        f"{row['ttft_p50_s'] * 1e3:7.1f} ms p99 {row['ttft_p99_s'] * 1e3:7.1f} ms, "
                        f"ITL p50 {row['itl_p50_s'] * 1e3:6.2f} ms p99 "
                        f"{row['itl_p99_s'] * 1e3:6.2f} ms, step {row['step_s'] * 1e3:6.2f} ms "
                        f"(mean batch {row['mean_batch']:.1f})",
                        flush=True,
                    )
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(120)
    write_results(
        args.json,
        {
            "device": model.device.name,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()

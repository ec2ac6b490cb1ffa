"""The OpenAI-compatible server as its users meet it: `python -m bitnet_gpu serve` as a process of
its own on 127.0.0.1 over a small checkpoint, driven by the official `openai` client (and raw
HTTP for what a client would never send). Every answer is compared with generate_text for that
request alone; every wait is bounded."""

import concurrent.futures
import dataclasses
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from bitnet_gpu.models import BitNetConfig, BitNetModel
from conftest import package_env
from hf_checkpoint import write_checkpoint

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("sse_starlette")
pytest.importorskip("prometheus_client")
pytest.importorskip("tokenizers")

CONTEXT = 128
CHUNK = 16  # prompts of more tokens are fed in chunks between decode steps
SCRIPT = str(Path(__file__).with_name("serve_checked.py"))


def http(url: str, body: bytes | None = None) -> tuple[int, str]:
    """(status, text) of a GET, or a POST of a JSON body: raw HTTP, as no client would send it."""
    request = urllib.request.Request(url, body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Server:
    """A server process on a free port of 127.0.0.1; stop() sends SIGTERM and checks that it
    exited cleanly, without a validation message."""

    def __init__(self, folder: Path, log: Path, *args: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command = [sys.executable, SCRIPT, "--weights", str(folder), "--port", str(self.port)]
        command += ["--max-tokens", str(CONTEXT), "--prefill-chunk", str(CHUNK), *args]
        with open(log, "w") as out:
            self.process = subprocess.Popen(command, env=package_env(), stderr=out, stdout=out)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "the server exited:\n" + log.read_text()
            try:
                if http(self.url + "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.process.kill()
        raise AssertionError("the server did not start in 300 s:\n" + log.read_text())

    def client(self, **kwargs):
        kwargs.setdefault("api_key", "unused")
        return openai.OpenAI(base_url=self.url + "/v1", max_retries=0, timeout=120, **kwargs)

    def metric(self, name: str) -> float:
        text = http(self.url + "/metrics")[1]
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        assert match, f"{name} not in /metrics"
        return float(match.group(1))

    def rss(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError("the server did not exit within 120 s of SIGTERM") from None
        log = self.log.read_text()
        assert "VALIDATION:" not in log, log
        assert code == 0 and "EXITED: 0" in log, log


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_checkpoint")
    config = BitNetConfig.preset("tiny", vocab_size=360, tie_word_embeddings=True)
    write_checkpoint(folder, config)
    return folder


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    running = Server(checkpoint, tmp_path_factory.mktemp("log") / "server.log", "--max-batch", "20")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def alone(checkpoint):
    """The model in this process, as the server runs it: one split of the attention in every
    step, prompts fed CHUNK tokens at a time."""
    model = BitNetModel.from_pretrained(checkpoint, max_tokens=CONTEXT)
    model.policy = dataclasses.replace(model.policy, split_by_context=False, prefill_chunk=CHUNK)
    return model


def name(checkpoint) -> str:
    """The served model's name: its checkpoint's path."""
    return str(checkpoint)


PROMPTS = [
    "The quick brown fox",
    "Ternary weights take three values. " * 3,  # more than one chunk
    "Grüße aus Köln",
    "BitNet b1.58 runs on any Vulkan GPU, with int8 activations and exact accumulators.",
]


def test_models_lists_the_checkpoint(server, checkpoint):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [name(checkpoint)]


def test_completions_equal_generate_text(server, checkpoint, alone):
    client = server.client()
    for prompt in PROMPTS:
        reply = client.completions.create(model=name(checkpoint), prompt=prompt, max_tokens=12)
        choice = reply.choices[0]
        expected = alone.generate_text(prompt, max_new_tokens=12)
        assert choice.text == expected
        ids = alone.tokenizer.encode(prompt)
        assert reply.usage.prompt_tokens == len(ids)
        assert choice.finish_reason == ("length" if reply.usage.completion_tokens == 12 else "stop")


def test_chat_completions_equal_generate_text(server, checkpoint, alone):
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "The quick brown fox?"},
    ]
    client = server.client()
    reply = client.chat.completions.create(model=name(checkpoint), messages=messages, max_tokens=10)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == alone.generate_text(messages, max_new_tokens=10)
    # Content as a list of text parts, as newer clients send it.
    parts = [dict(m, content=[{"type": "text", "text": m["content"]}]) for m in messages]
    again = client.chat.completions.create(model=name(checkpoint), messages=parts, max_tokens=10)
    assert again.choices[0].message.content == reply.choices[0].message.content


def test_streams_equal_generate_text_with_usage(server, checkpoint, alone):
    client = server.client()
    prompt = PROMPTS[1]
    chunks = list(
        client.completions.create(
            model=name(checkpoint),
            prompt=prompt,
            max_tokens=14,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == alone.generate_text(prompt, max_new_tokens=14)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert [c.choices[0].finish_reason for c in chunks[:-1]].count(None) == len(chunks) - 2
    messages = [{"role": "user", "content": PROMPTS[0]}]
    stream = client.chat.completions.create(
        model=name(checkpoint), messages=messages, max_tokens=9, stream=True
    )
    deltas = [c.choices[0].delta for c in stream]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == alone.generate_text(
        messages, max_new_tokens=9
    )


def test_seeded_sampling_equals_generate_text(server, checkpoint, alone):
    client = server.client()
    settings = [
        dict(temperature=0.8, seed=5),
        dict(temperature=1.2, top_p=0.9, seed=11),
        dict(temperature=0.7, top_p=0.8, extra_body={"top_k": 20}, seed=3),
    ]
    for options in settings:
        reply = client.completions.create(
            model=name(checkpoint), prompt=PROMPTS[0], max_tokens=16, **options
        )
        extra = options.pop("extra_body", {})
        expected = alone.generate_text(PROMPTS[0], max_new_tokens=16, **options, **extra)
        assert reply.choices[0].text == expected


def test_token_ids_and_lists_of_prompts(server, checkpoint, alone):
    client = server.client()
    ids = [alone.tokenizer.encode(p) for p in PROMPTS[2:]]
    by_ids = client.completions.create(model=name(checkpoint), prompt=ids, max_tokens=8)
    by_text = client.completions.create(model=name(checkpoint), prompt=PROMPTS[2:], max_tokens=8)
    assert [c.index for c in by_ids.choices] == [0, 1]
    for i, prompt in enumerate(PROMPTS[2:]):
        expected = alone.generate_text(prompt, max_new_tokens=8)
        assert by_ids.choices[i].text == by_text.choices[i].text == expected
    assert by_ids.usage.prompt_tokens == sum(len(i) for i in ids)
    single = client.completions.create(model=name(checkpoint), prompt=ids[0], max_tokens=8)
    assert single.choices[0].text == by_ids.choices[0].text


def test_stop_strings_cut_the_text(server, checkpoint, alone):
    prompt = max(PROMPTS, key=lambda p: len(alone.generate_text(p, max_new_tokens=20)))
    full = alone.generate_text(prompt, max_new_tokens=20)
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop and stop in full
    reply = server.client().completions.create(
        model=name(checkpoint), prompt=prompt, max_tokens=20, stop=[stop, "never there"]
    )
    assert reply.choices[0].text == full[: full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def _ask(server, checkpoint, index):
    """Request `index` of a mixed load, streamed: (its text, what it would be alone)."""
    prompt = PROMPTS[index % len(PROMPTS)]
    tokens = 4 + (index * 5) % 21
    options = {} if index % 3 else {"temperature": 0.9, "top_p": 0.95, "seed": index}
    client = server.client()
    if index % 2:
        messages = [{"role": "user", "content": prompt}]
        stream = client.chat.completions.create(
            model=name(checkpoint), messages=messages, max_tokens=tokens, stream=True, **options
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream)
        return text, (messages, tokens, options)
    stream = client.completions.create(
        model=name(checkpoint), prompt=prompt, max_tokens=tokens, stream=True, **options
    )
    return "".join(c.choices[0].text for c in stream), (prompt, tokens, options)


def test_concurrent_streams_each_equal_their_answer_alone(server, checkpoint, alone):
    def batch_histogram():
        return server.metric("bitnet_gpu_decode_batch_size_count"), server.metric(
            'bitnet_gpu_decode_batch_size_bucket{le="1.0"}'
        )

    steps_before, single_before = batch_histogram()
    with concurrent.futures.ThreadPoolExecutor(18) as pool:
        answers = list(pool.map(lambda i: _ask(server, checkpoint, i), range(18)))
    steps, single = batch_histogram()
    assert steps - steps_before > single - single_before, "no decode step ran two requests"
    for text, (prompt, tokens, options) in answers:
        assert text == alone.generate_text(prompt, max_new_tokens=tokens, **options)


def _error(call):
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value


def test_bad_requests_get_openai_errors(server, checkpoint):
    client = server.client()
    model = name(checkpoint)
    status, text = http(server.url + "/v1/completions", b'{"model": "x", "prompt": ')
    assert status == 400 and json.loads(text)["error"]["type"] == "invalid_request_error"
    error = _error(lambda: client.completions.create(model=model, prompt="a", temperature="hot"))
    assert error.status_code == 400 and error.body["param"] == "temperature"
    error = _error(lambda: client.completions.create(model="no-such-model", prompt="a"))
    assert error.status_code == 404 and isinstance(error, openai.NotFoundError)
    error = _error(lambda: client.completions.create(model=model, prompt="x " * 200))
    assert error.status_code == 400 and f"context is {CONTEXT} tokens" in error.message
    assert error.body["param"] == "prompt"
    error = _error(lambda: client.completions.create(model=model, prompt="a", max_tokens=500))
    assert error.status_code == 400 and error.body["param"] == "max_tokens"
    error = _error(lambda: client.completions.create(model=model, prompt="a", n=2))
    assert error.status_code == 400 and error.body["param"] == "n"
    error = _error(lambda: client.completions.create(model=model, prompt="a", logprobs=2))
    assert error.status_code == 400 and error.body["param"] == "logprobs"
    error = _error(lambda: client.completions.create(model=model, prompt=[[]]))
    assert error.status_code == 400 and error.body["param"] == "prompt"
    error = _error(lambda: client.completions.create(model=model, prompt=[400]))
    assert error.status_code == 400 and "[0, 360)" in error.message
    error = _error(
        lambda: client.completions.create(model=model, prompt="a", extra_body={"top_k": -3})
    )
    assert error.status_code == 400
    error = _error(lambda: client.chat.completions.create(model=model, messages=[{"role": "u"}]))
    assert error.status_code == 400 and error.body["param"] == "messages"
    error = _error(lambda: client.completions.create(model=model, prompt="a", max_tokens=0))
    assert error.status_code == 400 and error.body["param"] == "max_tokens"
    # The server goes on answering.
    reply = client.completions.create(model=model, prompt="a", max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_disconnected_stream_frees_its_slot(server, checkpoint):
    client = server.client()
    made = server.metric("bitnet_gpu_generation_tokens_total")
    stream = client.completions.create(
        model=name(checkpoint),
        prompt="a",
        max_tokens=120,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _, _ in zip(range(2), stream):
        pass
    stream.close()
    deadline = time.monotonic() + 30
    while server.metric("bitnet_gpu_running") > 0:
        assert time.monotonic() < deadline, "the request kept its slot"
        time.sleep(0.05)
    assert server.metric("bitnet_gpu_generation_tokens_total") - made < 120
    assert client.completions.create(model=name(checkpoint), prompt="a", max_tokens=3).choices


def test_memory_stays_flat_over_hundreds_of_requests(server, checkpoint):
    client = server.client()

    def run(count):
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = pool.map(
                lambda i: client.completions.create(
                    model=name(checkpoint), prompt=PROMPTS[i % 4], max_tokens=3 + i % 5
                ),
                range(count),
            )
            assert all(r.choices[0].finish_reason in ("stop", "length") for r in replies)

    run(60)  # every graph recorded, the allocator's pools at their size
    before = server.rss()
    run(300)
    grown = server.rss() - before
    assert grown < 24 * 2**20, f"the server grew by {grown / 2**20:.1f} MiB over 300 requests"


def test_metrics_count_requests_and_tokens(server, checkpoint):
    client = server.client()
    client.completions.create(model=name(checkpoint), prompt="a", max_tokens=2)
    _error(lambda: client.completions.create(model="another", prompt="a"))
    text = http(server.url + "/metrics")[1]
    for metric in [
        "bitnet_gpu_requests_total",
        "bitnet_gpu_prompt_tokens_total",
        "bitnet_gpu_queue_length",
        "bitnet_gpu_batch_occupancy",
        "bitnet_gpu_time_to_first_token_seconds_bucket",
        "bitnet_gpu_inter_token_latency_seconds_bucket",
    ]:
        assert metric in text
    assert server.metric('bitnet_gpu_requests_total{route="/v1/completions",status="200"}') > 0
    assert server.metric('bitnet_gpu_requests_total{route="/v1/completions",status="404"}') >= 1


def test_api_key_full_queue_and_sigterm(checkpoint, tmp_path, alone):
    """A server of one slot and one waiting place, behind an API key: the third request at once
    gets 429; SIGTERM lets the stream in flight finish, then the process exits."""
    small = Server(
        checkpoint,
        tmp_path / "server.log",
        "--max-batch",
        "1",
        "--max-queue",
        "1",
        "--api-key",
        "sesame",
    )
    try:
        error = _error(lambda: small.client().models.list())
        assert error.status_code == 401 and isinstance(error, openai.AuthenticationError)
        client = small.client(api_key="sesame")
        long = dict(model=name(checkpoint), max_tokens=100, stream=True)
        long["extra_body"] = {"ignore_eos": True}
        first = client.completions.create(prompt="a", **long)
        pieces = [next(iter(first)).choices[0].text]
        waiting = client.completions.create(prompt="b", **long)  # in the queue once it answers
        error = _error(lambda: client.completions.create(model=name(checkpoint), prompt="c"))
        assert error.status_code == 429 and isinstance(error, openai.RateLimitError)
        waiting.close()
        small.process.send_signal(signal.SIGTERM)
        chunks = list(first)
        pieces += [c.choices[0].text for c in chunks]
        assert chunks[-1].choices[0].finish_reason == "length"
        expected = alone.generate_text("a", max_new_tokens=100, eos_token_id=[])
        assert "".join(pieces) == expected
    finally:
        small.stop()


def test_serve_explains_a_missing_tokenizer(tmp_path):
    folder = tmp_path / "checkpoint"
    write_checkpoint(folder, BitNetConfig.preset("tiny", vocab_size=360), tokenizer=False)
    result = subprocess.run(
        [sys.executable, "-m", "bitnet_gpu", "serve", "--weights", str(folder), "--port", "0"],
        env=package_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "--tokenizer" in result.stderr


def test_generation_request_body_round_trips_json():
    from bitnet_gpu.serving.protocol import CompletionRequest, unsupported, ApiError

    body = CompletionRequest.model_validate(json.loads('{"model": "m", "prompt": [1, 2]}'))
    unsupported(body)
    with pytest.raises(ApiError, match="presence_penalty"):
        unsupported(CompletionRequest(model="m", prompt="a", presence_penalty=0.5))
    assert np.array(body.prompt).tolist() == [1, 2]

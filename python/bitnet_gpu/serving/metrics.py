"""The server's Prometheus metrics (prometheus_client), in a registry of its own: requests by
route and status, prompt and generated tokens, the queue, the batch, and the time to the first
token, between tokens and a whole request."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]

# Seconds: from a millisecond (a decode step) to a few minutes (a long request on a CPU device).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self, max_batch: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "bitnet_gpu_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter("bitnet_gpu_prompt_tokens", "Prompt tokens fed", registry=r)
        self.generated_tokens = Counter(
            "bitnet_gpu_generation_tokens", "Tokens generated", registry=r
        )
        self.queue = Gauge("bitnet_gpu_queue_length", "Requests waiting for a slot", registry=r)
        self.running = Gauge("bitnet_gpu_running", "Requests in the running batch", registry=r)
        self.occupancy = Gauge(
            "bitnet_gpu_batch_occupancy", "The running batch over its slots (0 to 1)", registry=r
        )
        self.batch = Histogram(
            "bitnet_gpu_decode_batch_size",
            "Sequences a decode step ran",
            buckets=tuple(sorted({1, 2, 4, 8, 16, 32, 64, max_batch})),
            registry=r,
        )

        def seconds(name: str, text: str) -> Histogram:
            return Histogram(name, text, buckets=_BUCKETS, registry=r)

        self.step = seconds("bitnet_gpu_decode_step_seconds", "Wall time of a decode step")
        self.ttft = seconds(
            "bitnet_gpu_time_to_first_token_seconds", "From a request's arrival to its first token"
        )
        self.itl = seconds(
            "bitnet_gpu_inter_token_latency_seconds", "Between a request's consecutive tokens"
        )
        self.latency = seconds("bitnet_gpu_request_seconds", "A request from arrival to its end")
        self.max_batch = max_batch

    def observe_step(self, batch: int, seconds: float) -> None:
        self.batch.observe(batch)
        self.step.observe(seconds)

    def sample(self, waiting: int, running: int) -> None:
        self.queue.set(waiting)
        self.running.set(running)
        self.occupancy.set(running / self.max_batch)

    def text(self) -> bytes:
        return generate_latest(self.registry)

"""An OpenAI-compatible HTTP server over the BitNet decoder, with continuous batching
(``python -m bitnet_gpu serve``; ``pip install ".[serve]"``): engine.py runs the batch on the GPU,
api.py speaks HTTP, requests.py joins the two, protocol.py holds the API's shapes and metrics.py
what /metrics reports."""

from .engine import Engine, EngineRequest, QueueFull

__all__ = ["Engine", "EngineRequest", "QueueFull", "create_app"]


def create_app(*args, **kwargs):
    """serving.api.create_app (FastAPI imported only when a server is made)."""
    from .api import create_app as create

    return create(*args, **kwargs)

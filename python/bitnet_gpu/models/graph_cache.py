"""The recorded step graphs of one CachePool, by StepPlan: each shape recorded at its first use
and replayed after. Decode graphs (one token a sequence) are kept for as long as the pool; graphs
of several tokens a sequence hold their intermediates (hundreds of MB for long prompts), so only
the most recently used few of them are kept."""

from __future__ import annotations

from collections.abc import Callable

from .recording import RecordedStep
from .step import StepPlan

__all__ = ["GraphCache"]


class GraphCache:
    """record(plan) records a plan's graph; timing() says how graphs are timed now (a graph
    recorded under another timing is recorded again)."""

    def __init__(
        self,
        record: Callable[[StepPlan], RecordedStep],
        timing: Callable[[], object],
        kept_prefill: int = 2,
    ) -> None:
        self._record, self._timing = record, timing
        self.kept_prefill = kept_prefill
        self._graphs: dict[tuple[StepPlan, object], RecordedStep] = {}

    def get(self, plan: StepPlan) -> RecordedStep:
        """The graph of `plan`, recorded now if it is not kept."""
        key = (plan, self._timing())
        graph = self._graphs.pop(key, None)
        if graph is None:
            prefill = [k for k in self._graphs if k[0].prefill]
            if plan.prefill and len(prefill) >= max(1, self.kept_prefill):
                del self._graphs[prefill[0]]  # the least recently used
            graph = self._record(plan)
        self._graphs[key] = graph  # most recently used last
        return graph

    def plans(self) -> list[StepPlan]:
        """The plans of the kept graphs, least recently used first."""
        return [plan for plan, _ in self._graphs]

    def clear(self) -> None:
        self._graphs.clear()

    def __len__(self) -> int:
        return len(self._graphs)

    def __repr__(self) -> str:
        return f"<bitnet_gpu.models.GraphCache graphs={len(self._graphs)}>"

"""KV cache slots: the keys and values of up to `slots` sequences on the device, and the graphs
recorded over them. A sequence holds a slot while it runs; steps read and write the slots they
name, so sequences can join and leave a running batch without the others' caches moving."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import _core
from .._core import Tensor
from .graph_cache import GraphCache

if TYPE_CHECKING:
    from .config import BitNetConfig
    from .recording import StepRecorder

__all__ = ["CachePool"]


class CachePool:
    """Caches [slots, max_tokens, kv heads, head dim] a layer, keys and values (float32, or
    float16: `dtype`), allocated at the first step, and the GraphCache of the steps recorded over
    them."""

    def __init__(
        self,
        recorder: StepRecorder,
        config: BitNetConfig,
        max_tokens: int,
        slots: int,
        kept_prefill: int = 2,
        dtype: np.dtype = np.dtype(np.float32),
    ) -> None:
        self.config, self.max_tokens, self.slots = config, max_tokens, slots
        self.dtype = np.dtype(dtype)
        self._recorder = recorder
        self._caches: list[tuple[Tensor, Tensor]] | None = None
        self._free = list(range(slots))
        self.graphs = GraphCache(
            lambda plan: recorder.record(plan, self.caches), lambda: recorder.timings, kept_prefill
        )

    @property
    def caches(self) -> list[tuple[Tensor, Tensor]]:
        """Each layer's (keys, values), allocated now if not yet."""
        if self._caches is None:
            c = self.config
            shape = (self.slots, self.max_tokens, c.num_key_value_heads, c.head_dim)
            device = self._recorder.device
            self._caches = [
                (device.empty(shape, self.dtype), device.empty(shape, self.dtype))
                for _ in range(c.num_hidden_layers)
            ]
        return self._caches

    @property
    def nbytes(self) -> int:
        """Bytes of the caches on the device (0 before the first step)."""
        return sum(k.nbytes + v.nbytes for k, v in self._caches) if self._caches else 0

    # ------------------------------------------------------------------------------ slots
    def acquire(self) -> int:
        """A free slot (the lowest), now held; ArgumentError where every slot is held."""
        if not self._free:
            raise _core.ArgumentError(f"every one of the {self.slots} cache slots is in use")
        self._free.sort()
        return self._free.pop(0)

    def release(self, slot: int) -> None:
        """Gives a held slot back (its cached tokens are forgotten)."""
        if not 0 <= slot < self.slots or slot in self._free:
            raise _core.ArgumentError(f"slot {slot} is not held")
        self._free.append(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def __repr__(self) -> str:
        return (
            f"<bitnet_gpu.models.CachePool slots={self.slots} free={len(self._free)} "
            f"max_tokens={self.max_tokens} dtype={self.dtype.name} nbytes={self.nbytes} "
            f"graphs={len(self.graphs)}>"
        )

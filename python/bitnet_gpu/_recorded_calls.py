"""Small NumPy-in, NumPy-out calls repeated with the same op, parameters, shapes and dtypes replay
a command buffer recorded for them, instead of recording their dispatch again.

An eager call records its dispatch, submits it and waits; recording costs about a third of a small
call (docs/PERFORMANCE.md). The second call with one key records the op once into a graph
whose input and output tensors belong to the cache; that call and later ones copy their arrays
into the inputs, replay the graph and return fresh copies of its outputs, so what a call returns
is the caller's alone, as an eager call's result is. Only calls whose arrays are small take this
path: above `MOST_BYTES` copying a result into a fresh array costs more than the eager call's view
of host memory saves. A key that is busy in another thread runs eagerly; any failure while a call
records leaves it to the eager path, which raises the op's own error.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict

import numpy as np

from . import _core

MOST_BYTES = 64 * 1024  # the largest array (input or result) a recorded call takes
# Keys a device keeps (recorded, seen once or eager), the least recently used dropped first.
CAPACITY = 32


class _Recorded:
    __slots__ = ("graph", "inputs", "outputs", "lock")

    def __init__(self, graph, inputs, outputs):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        self.lock = threading.Lock()


_SEEN = "seen"  # a key called once: the next call records it
_EAGER = "eager"  # a key that failed to record, or whose results are too large: always eager


class RecordedCalls:
    """One device's recorded calls, by key (see the module's docstring)."""

    def __init__(self):
        self._entries: OrderedDict = OrderedDict()  # key -> _Recorded, _SEEN or _EAGER
        self._lock = threading.Lock()
        self._watched: set[int] = set()  # ids of live owners with a finalizer
        self._dead: list[int] = []  # ids of owners collected since
        self.recordings = 0  # keys recorded so far, dropped ones included

    def __len__(self):
        with self._lock:
            return sum(isinstance(entry, _Recorded) for entry in self._entries.values())

    def clear(self):
        with self._lock:
            self._entries.clear()

    def call(self, device, key, arrays, specs, record, owner=None):
        """Fresh NumPy results of a recorded call, or None where the caller should run it eagerly.

        key: hashable, naming the op and every parameter that is not an array. arrays: the call's
        NumPy inputs, C contiguous, dtypes checked. specs: [(shape, dtype)] of the results.
        record(inputs, outputs): records the op from the input Tensors into the output Tensors.
        owner: an object the recording holds (weights): its calls are dropped when it is
        collected, and it is not kept alive for them."""
        if self._dead:
            with self._lock:
                self._forget_dead()
        full = (
            None if owner is None else id(owner),
            key,
            *[(a.shape, a.dtype.char) for a in arrays],
        )
        entry = self._entries.get(full)  # the common case takes no lock: one dict read
        if entry.__class__ is not _Recorded:
            entry = self._first_calls(device, full, entry, arrays, specs, record, owner)
            if entry is None:
                return None
        try:  # the least recently used key goes first, so a hot key outlives a stream of others
            self._entries.move_to_end(full)
        except KeyError:  # dropped by another thread meanwhile: this call still replays
            pass
        if not entry.lock.acquire(blocking=False):  # another thread is replaying it
            return None
        try:
            return entry.graph.replay_with(entry.inputs, arrays, entry.outputs)
        except _core.Error:
            with self._lock:
                self._entries.pop(full, None)
            raise
        finally:
            entry.lock.release()

    def _first_calls(self, device, full, entry, arrays, specs, record, owner):
        # The entry to replay for a key not recorded yet, recording it on its second call; None
        # to run this call eagerly.
        if entry is _EAGER:
            return None
        if entry is None:  # first seen: run eagerly, remember the key
            with self._lock:
                self._entries[full] = _SEEN
                while len(self._entries) > CAPACITY:
                    self._entries.popitem(last=False)
                if owner is not None and id(owner) not in self._watched:
                    self._watched.add(id(owner))
                    weakref.finalize(owner, self._dead.append, id(owner))
            return None
        fits = all(
            math.prod(shape) * np.dtype(dtype).itemsize <= MOST_BYTES for shape, dtype in specs
        )
        recorded = _record(device, arrays, specs, record) if fits else None
        with self._lock:
            if self._entries.get(full) is not _SEEN:  # another thread got there, or it was dropped
                return None
            self._entries[full] = _EAGER if recorded is None else recorded
            self.recordings += recorded is not None
        return recorded

    def _forget_dead(self):
        # Owners' finalizers only append (they may run inside any call, lock held or not).
        while self._dead:
            owner = self._dead.pop()
            self._watched.discard(owner)
            for full in [f for f in self._entries if f[0] == owner]:
                del self._entries[full]


def _record(device, arrays, specs, record):
    try:
        graph = _core.RecordedGraph(device, "off", False)
        inputs = [device.empty(a.shape, a.dtype) for a in arrays]
        outputs = [device.empty(shape, dtype, memory="host") for shape, dtype in specs]
        graph.begin()
        try:
            record(inputs, outputs)
        finally:
            if graph.recording:
                graph.end()
    except Exception:  # noqa: BLE001 - the eager call then raises the op's own error
        return None
    return _Recorded(graph, inputs, outputs)


_state_lock = threading.Lock()
_default = None  # (the default device's Python object, its RecordedCalls)
_enabled = None  # the `recorded_calls` knob, read by refresh() (None: not yet)


def refresh():
    """Reads the `recorded_calls` tuning knob (unset: on) and returns it; turning it off drops
    every recorded call. _tuning calls this whenever the knobs change. A malformed environment
    leaves calls eager, where the ops that read the knobs raise its error."""
    global _enabled
    try:
        _enabled = _core.get_tuning()["recorded_calls"] is not False
    except _core.ArgumentError:
        _enabled = False
    if not _enabled:
        clear_all()
    return _enabled


def call(key, arrays, specs, record, owner=None):
    """Fresh NumPy results of `record` replayed on the default device (RecordedCalls.call), or
    None where the caller should run the op eagerly: the knob off, arrays that are not all
    non-empty C-contiguous NumPy arrays of at most MOST_BYTES, or results over it."""
    if not _enabled:
        if _enabled is not None or not refresh():
            return None
    for a in arrays:
        if type(a) is not np.ndarray or not a.flags.c_contiguous or not 0 < a.nbytes <= MOST_BYTES:
            return None
    device = _core.default_device()
    if _core.recording(device):  # inside a graph the eager call records and returns Tensors
        return None
    current = _default
    if current is None or current[0] is not device:
        current = _replace_default(device)
    return current[1].call(device, key, arrays, specs, record, owner)


def _replace_default(device):
    # A new default device (the first, or one after a loss): its Python object is held here, so
    # that its calls stay recorded.
    global _default
    with _state_lock:
        if _default is None or _default[0] is not device:
            _default = (device, RecordedCalls())
        return _default


def recorded_count():
    """Recorded calls the default device holds now."""
    current = _default
    return 0 if current is None else len(current[1])


def recordings_made():
    """Calls the default device has recorded since its calls were last dropped, including those
    whose keys it has dropped since."""
    current = _default
    return 0 if current is None else current[1].recordings


def clear_all():
    """Drops every recorded call (before the default device is released at exit)."""
    global _default
    with _state_lock:
        if _default is not None:
            _default[1].clear()
        _default = None

"""Recorded graphs: ops recorded once into one command buffer, replayed with new input data.

    g = bitnet_gpu.Graph()                  # or device.graph()
    with g:
        x = g.input("x", (1, 2560))         # a Tensor the graph reads at every run
        y = bitnet_gpu.rms_norm(x, weight)  # ops record instead of running; results are Tensors
        g.output("y", y)
    result = g.run(x=array)                 # one submission; {"y": Tensor}

Replay does no Python work per op: `run` copies the inputs it is given into their tensors,
submits the recorded command buffer once and waits. Checks an op makes on its results (NaN/Inf
in activations, token ids out of range) run after every replay and raise there. Outputs are the
graph's own tensors, overwritten by the next run (`numpy=True` returns copies instead).
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._core import Tensor

__all__ = ["Graph"]


class Graph:
    """Ops recorded once and replayed in one queue submission (see the module's docstring)."""

    def __init__(self, device=None, *, timings=False, reuse_memory=False):
        """timings: False, True (a timestamp after every op) or "total" (one pair around the
        whole graph); the last run's are then in timings(). reuse_memory: a tensor of 256 KiB or
        more that an op made while the graph recorded and that nothing holds any more (Python
        dropped it) gives its memory to a later op's tensor, so a graph of many layers holds about
        one layer's intermediates; for graphs whose ops read only what earlier ops wrote, inputs
        and tensors held by the caller (never a tensor filled from NumPy and then dropped)."""
        from . import default_device

        self.device = device or default_device()
        mode = "total" if timings == "total" else ("per_op" if timings else "off")
        self._core = _core.RecordedGraph(self.device, mode, bool(reuse_memory))
        self._inputs: dict[str, Tensor] = {}
        self._input_dtypes: dict[str, np.dtype] = {}
        self._outputs: dict[str, Tensor] = {}
        self._failed = None

    def __enter__(self):
        self._core.begin()
        return self

    def __exit__(self, kind, value, traceback):
        if self._core.recording:
            self._core.end()
        if kind is not None:
            self._failed = f"{kind.__name__}: {value}"
        return False

    def input(self, name, shape, dtype=np.float32, *, value=None):
        """A named input: a Tensor of this shape and dtype that ops read; `run(name=array)`
        overwrites it before a replay (an input not given keeps its last value)."""
        if name in self._inputs:
            raise _core.ArgumentError(f"input {name!r} is already defined")
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(d) for d in shape)
        t = self.device.empty(shape, np.dtype(dtype))
        if value is not None:
            t.copy_from(np.asarray(value, np.dtype(dtype)))
        self._inputs[name] = t
        self._input_dtypes[name] = t.dtype
        return t

    def output(self, name, tensor):
        """Names a Tensor an op produced while recording as an output of `run`."""
        if not isinstance(tensor, Tensor):
            raise _core.DTypeError(
                f"output {name!r}: expected a Tensor, got {type(tensor).__name__}"
            )
        if name in self._outputs:
            raise _core.ArgumentError(f"output {name!r} is already defined")
        self._outputs[name] = tensor
        return tensor

    @property
    def inputs(self):
        return dict(self._inputs)

    @property
    def outputs(self):
        return dict(self._outputs)

    @property
    def op_count(self):
        """Dispatches and copies recorded."""
        return self._core.op_count

    @property
    def barrier_count(self):
        """Pipeline barriers recorded: each makes the GPU finish what came before it."""
        return self._core.barrier_count

    def run(self, inputs=None, /, *, numpy=False, **named):
        """Copies the given inputs (NumPy arrays or Tensors, by name) into the graph, replays it
        once and returns {name: output}: the graph's Tensors, or NumPy copies with numpy=True."""
        if self._failed:
            raise _core.ArgumentError(f"this graph cannot run: recording it raised {self._failed}")
        if self._core.recording:
            raise _core.ArgumentError("this graph is still recording: leave its `with` block first")
        given = {**inputs, **named} if inputs else named
        for name in given:
            if name not in self._inputs:
                known = ", ".join(sorted(self._inputs)) or "none"
                raise _core.ArgumentError(f"unknown input {name!r} (inputs: {known})")
        for name, value in given.items():
            target = self._inputs[name]
            if not isinstance(value, Tensor):
                value = np.asarray(value)
                expected = self._input_dtypes[name]  # kept: a Tensor's dtype is made per read
                if value.dtype != expected:
                    raise _core.DTypeError(
                        f"input {name!r}: expected {expected}, got {value.dtype}"
                    )
            target.copy_from(value)
        self._core.replay()
        if numpy:
            return {name: t.numpy() for name, t in self._outputs.items()}
        return dict(self._outputs)

    def timings(self):
        """[(kernel, seconds)] of the last run, from timestamps (Graph(timings=True)); with
        timings="total", one entry for the whole graph."""
        return self._core.timings()

    def __repr__(self):
        state = "recording" if self._core.recording else ("ready" if self._core.closed else "new")
        return (
            f"<bitnet_gpu.Graph {state} ops={self.op_count} inputs={list(self._inputs)} "
            f"outputs={list(self._outputs)}>"
        )

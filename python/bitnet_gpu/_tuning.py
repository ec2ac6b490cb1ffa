"""Tuning knobs: the choices the ops make for a device and a shape (kernel variants, tile sizes,
workgroup counts), each overridable for a block of code or through the environment.

``with bg.tuning(matvec_rows=4): ...`` runs the block with that knob set (``None`` restores the
op's own rule); ``bg.get_tuning()`` gives every knob's current value. The environment's
``BITNET_GPU_<KNOB>`` variables are read once per process. docs/TUNING.md lists every knob. The
setting is process-wide, not per thread. Graphs keep what was in force when they were recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

from . import _core
from . import _recorded_calls as recorded_calls

__all__ = ["Knob", "get_tuning", "tuning", "tuning_knobs"]


class Knob(NamedTuple):
    name: str
    variable: str  # its environment variable
    values: str  # the values it takes, as the documentation writes them


def tuning_knobs() -> list[Knob]:
    """Every tuning knob, with its environment variable and the values it takes."""
    return [Knob(*knob) for knob in _core.tuning_knobs()]


def get_tuning() -> dict:
    """Every knob's value in force: a bool, an int or a tile string, or None where the op's own rule
    decides."""
    return dict(_core.get_tuning())


def _value(name: str, value):
    if name.endswith("_tile") and isinstance(value, tuple):
        return "x".join(str(int(v)) for v in value)
    return value


@contextlib.contextmanager
def tuning(**knobs) -> Iterator[dict]:
    """Sets the named knobs for the block (checked first: ``ArgumentError`` naming the knob and
    what it takes) and restores the previous settings after it, even on an exception."""
    before = get_tuning()
    after = dict(before)
    for name, value in knobs.items():
        if name not in before:
            raise TypeError(
                f"tuning() got an unexpected keyword argument '{name}' (knobs: {', '.join(before)})"
            )
        after[name] = _value(name, value)
    _core.set_tuning(after)
    recorded_calls.refresh()
    try:
        yield get_tuning()
    finally:
        _core.set_tuning(before)
        recorded_calls.refresh()

"""Reading a checkpoint: a safetensors file, a checkpoint directory (one file or shards with
model.safetensors.index.json) or a dict of arrays, with config.json and generation_config.json
where a directory holds them."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from .. import _core
from ..checkpoint import load_safetensors
from ..text import load_generation_config
from .config import BitNetConfig

__all__ = ["Checkpoint", "checkpoint_directory", "read_checkpoint"]


@dataclasses.dataclass
class Checkpoint:
    """What a checkpoint holds: the config it runs with, its tensors by name, its
    generation_config.json ({} without one), the directory (None for a dict) and a name for it."""

    config: BitNetConfig
    tensors: Mapping[str, Any]
    generation_config: dict
    folder: str | None
    source: str

    @property
    def nbytes(self) -> int:
        return sum(getattr(t, "nbytes", 0) for t in self.tensors.values())


def checkpoint_directory(path: Any) -> str:
    """`path` as a string where it names a directory with a config.json (from_pretrained's
    argument); TypeError or ArgumentError otherwise."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a directory path, got {type(path).__name__}")
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise _core.ArgumentError(f"from_pretrained: {folder} is not a checkpoint directory")
    if not os.path.exists(os.path.join(folder, "config.json")):
        raise _core.ArgumentError(f"from_pretrained: {folder} has no config.json")
    return folder


def read_checkpoint(
    weights: Mapping[str, Any] | str | os.PathLike[str], config: BitNetConfig | None
) -> Checkpoint:
    """The checkpoint at `weights` (a path) or of `weights` (a dict). config.json is read from
    the directory, or beside a single file, unless `config` is given; a head of its own
    (lm_head.weight) unties the config's embedding."""
    folder, generation_config = None, {}
    if isinstance(weights, (str, os.PathLike)):
        path = os.fspath(weights)
        source = path
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        if config is None and os.path.exists(os.path.join(folder, "config.json")):
            config = BitNetConfig.from_dict(_read_json(os.path.join(folder, "config.json")))
        tensors: Mapping[str, Any] = load_safetensors(path)
        generation_config = load_generation_config(folder)
    elif isinstance(weights, Mapping):
        source, tensors = "arrays", weights
    else:
        raise TypeError(
            f"weights: expected a dict of arrays or a path, got {type(weights).__name__}"
        )
    if config is None:
        raise _core.ArgumentError("from_weights: pass a config (BitNetConfig.preset(...))")
    if not isinstance(config, BitNetConfig):
        raise TypeError(f"config: expected a BitNetConfig, got {type(config).__name__}")
    if "lm_head.weight" in tensors and config.tie_word_embeddings:
        config = dataclasses.replace(config, tie_word_embeddings=False)
    return Checkpoint(config, tensors, generation_config, folder, source)


def _read_json(path: str) -> dict:
    """A JSON object from `path`; ArgumentError naming the file where it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError) as error:
        raise _core.ArgumentError(f"{path}: not a JSON file ({error})") from None
    if not isinstance(values, dict):
        raise _core.ArgumentError(f"{path}: expected a JSON object")
    return values

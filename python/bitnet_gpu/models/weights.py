"""The decoder's parameters on the device: read from a checkpoint's tensors as transformers
computes them, or random for tests and benchmarks."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _core
from .._core import Device, Tensor
from ..quantize import TernaryWeights, quantize_weights
from .config import NORMS, PROJECTIONS, BitNetConfig, layer_shapes, weight_names

__all__ = ["DecoderWeights", "LayerWeights", "WeightsAccess", "unpack_hf_ternary", "table_dtype"]


def unpack_hf_ternary(packed: np.ndarray, rows: int) -> np.ndarray:
    """int8 [rows, K] from transformers' packed BitNet weights uint8 [rows / 4, K]: row
    i * (rows / 4) + r holds bits 2i..2i+1 of packed row r, minus one."""
    packed = np.asarray(packed, np.uint8)
    quarter = packed.shape[0]
    out = np.empty((4 * quarter,) + packed.shape[1:], np.int8)
    for i in range(4):
        out[i * quarter : (i + 1) * quarter] = ((packed >> (2 * i)) & 3).astype(np.int8) - 1
    return out[:rows]


def pack_values(values: np.ndarray) -> np.ndarray:
    """uint8 [N, ceil(K / 16) * 4]: ternary values int8 [N, K] in the packed layout
    (docs/NUMERICS.md: code value + 1, weight 4b + i in bits 2i..2i+1 of byte b, rows padded with
    zero weights to a multiple of 16)."""
    n, k = values.shape
    codes = np.ones((n, -(-k // 16) * 16), np.uint8)
    codes[:, :k] = (values.astype(np.int16) + 1).astype(np.uint8)
    quads = codes.reshape(n, -1, 4)
    return (quads[..., 0] | quads[..., 1] << 2 | quads[..., 2] << 4 | quads[..., 3] << 6).astype(
        np.uint8
    )


# The packed byte of four ternary codes c0 + 3 c1 + 9 c2 + 27 c3 (each code a value plus one).
_BYTE_OF_CODES = np.array(
    [sum(((n // 3**j) % 3) << (2 * j) for j in range(4)) for n in range(81)], np.uint8
)


def _random_packed(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Packed bytes of uniformly random ternary weights [rows, cols], padding weights zero."""
    row_bytes = -(-cols // 16) * 4
    packed = _BYTE_OF_CODES[rng.integers(0, 81, size=(rows, row_bytes), dtype=np.uint8)]
    if row_bytes * 4 != cols:
        codes = (packed[..., None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
        values = codes.reshape(rows, -1)[:, :cols].astype(np.int8) - 1
        packed = pack_values(values)
    return packed


def table_dtype(weights: Mapping[str, Any]) -> np.dtype:
    """The dtype the embedding and head keep on the device: what the checkpoint holds, float16
    only where that loses nothing (a float16 table, or a bfloat16 or float32 one whose every value
    float16 holds exactly, as the 2B4T checkpoint's do), else float32."""
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        table = weights.get(name)
        if table is None:
            continue
        table = np.asarray(table)
        if table.dtype == np.float16:
            continue
        if table.dtype.kind != "f":
            return np.dtype(np.float32)  # checked and refused by DecoderWeights.load
        with np.errstate(over="ignore", invalid="ignore"):
            narrowed = table.astype(np.float16)
        if not np.array_equal(narrowed.astype(table.dtype), table):
            return np.dtype(np.float32)
    return np.dtype(np.float16)


@dataclasses.dataclass
class LayerWeights:
    """One decoder layer: its seven projections by short name (q, k, v, o, gate, up, down) and its
    four norms' weights by module path."""

    projections: dict[str, TernaryWeights] = dataclasses.field(default_factory=dict)
    norms: dict[str, Tensor] = dataclasses.field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.projections.values()) + sum(
            t.nbytes for t in self.norms.values()
        )


class DecoderWeights:
    """Everything a step reads: the embedding, the head (the embedding where tied), the final
    norm's weight and the layers."""

    def __init__(
        self, embed: Tensor, lm_head: Tensor, norm: Tensor, layers: list[LayerWeights]
    ) -> None:
        self.embed, self.lm_head, self.norm, self.layers = embed, lm_head, norm, layers

    @property
    def nbytes(self) -> int:
        """Bytes on the device: packed projections, embedding, head and norms."""
        total = self.embed.nbytes + self.norm.nbytes + sum(layer.nbytes for layer in self.layers)
        return total + (self.lm_head.nbytes if self.lm_head is not self.embed else 0)

    @property
    def projection_nbytes(self) -> int:
        """Bytes of the packed ternary projections alone (what a decode step must read)."""
        return sum(w.nbytes for layer in self.layers for w in layer.projections.values())

    @classmethod
    def random(
        cls, config: BitNetConfig, seed: int, embedding_dtype: np.dtype, device: Device
    ) -> DecoderWeights:
        """Random ternary weights (uniform over {-1, 0, 1}, gamma = 1 / sqrt(in_features)),
        embedding N(0, 1), norm weights near one."""
        rng = np.random.default_rng(seed)
        h, v = config.hidden_size, config.vocab_size
        embed = Tensor.from_numpy(
            rng.standard_normal((v, h), np.float32).astype(embedding_dtype), device
        )
        lm_head = embed
        if not config.tie_word_embeddings:
            head = rng.standard_normal((v, h), np.float32) / np.float32(math.sqrt(h))
            lm_head = Tensor.from_numpy(head.astype(embedding_dtype), device)
        norm = Tensor.from_numpy((1 + 0.1 * rng.standard_normal(h)).astype(np.float32), device)
        projections, norms = layer_shapes(config)
        layers = []
        for _ in range(config.num_hidden_layers):
            layer = LayerWeights()
            for short, (rows, cols) in projections.items():
                gamma = np.float32(1.0 / math.sqrt(cols))
                packed = _random_packed(rng, rows, cols)
                layer.projections[short] = TernaryWeights.from_packed(
                    packed, gamma, (rows, cols), device=device
                )
            for name, size in norms.items():
                layer.norms[name] = Tensor.from_numpy(
                    (1 + 0.1 * rng.standard_normal(size)).astype(np.float32), device
                )
            layers.append(layer)
        return cls(embed, lm_head, norm, layers)

    @classmethod
    def load(
        cls,
        weights: Mapping[str, Any],
        config: BitNetConfig,
        embedding_dtype: np.dtype,
        device: Device,
        progress: bool = False,
    ) -> DecoderWeights:
        """From a checkpoint's tensors by transformers' names (see projection for the forms a
        projection may take); ShapeError naming every missing or misshapen tensor."""
        expected = weight_names(config)
        _check(weights, expected, config)
        embed = Tensor.from_numpy(
            np.asarray(weights["model.embed_tokens.weight"]).astype(embedding_dtype), device
        )
        lm_head = embed
        if not config.tie_word_embeddings:
            lm_head = Tensor.from_numpy(
                np.asarray(weights["lm_head.weight"]).astype(embedding_dtype), device
            )
        norm = Tensor.from_numpy(np.asarray(weights["model.norm.weight"], np.float32), device)
        indices: Any = range(config.num_hidden_layers)
        if progress:
            from tqdm import tqdm  # type: ignore[import-untyped]

            indices = tqdm(indices, "loading layers", unit="layer", file=sys.stderr)
        layers = []
        for index in indices:
            p = f"model.layers.{index}."
            layer = LayerWeights()
            for module, short in PROJECTIONS:
                shape = expected[p + module + ".weight"]
                layer.projections[short] = projection(weights, p + module, shape, config, device)
            for name in NORMS:
                layer.norms[name] = Tensor.from_numpy(
                    np.asarray(weights[p + name + ".weight"], np.float32), device
                )
            layers.append(layer)
        return cls(embed, lm_head, norm, layers)

    def reference_params(self) -> dict[str, Any]:
        """The parameters as NumPy (ternary values and gammas), for reference.bitnet_forward."""
        layers = []
        for layer in self.layers:
            proj = {
                k: (w.unpack(), float(np.asarray(w.scale).reshape(-1)[0]))
                for k, w in layer.projections.items()
            }
            layers.append({"proj": proj, "norms": {k: t.numpy() for k, t in layer.norms.items()}})
        return {
            "embed": self.embed.numpy().astype(np.float32),
            "lm_head": self.lm_head.numpy().astype(np.float32),
            "norm": self.norm.numpy(),
            "layers": layers,
        }


def _check(weights: Mapping[str, Any], expected: dict[str, tuple[int, ...]], config) -> None:
    """ShapeError naming every tensor that is missing, misshapen or not real numbers."""
    problems = []
    for name, shape in expected.items():
        if name not in weights:
            problems.append(f"missing {name} {shape}")
            continue
        got = tuple(np.shape(weights[name]))
        kind = np.asarray(weights[name]).dtype
        if kind.kind not in "biuf":
            problems.append(f"{name}: expected real numbers, got dtype {kind}")
            continue
        packed_shape = (-(-shape[0] // 4), shape[1]) if len(shape) == 2 else None
        is_packed = kind == np.uint8 and got == packed_shape
        scale = name.replace(".weight", ".weight_scale")
        if got != shape and not is_packed:
            problems.append(f"{name}: expected shape {shape}, got {got}")
        elif kind in (np.uint8, np.int8) and not config.online and scale not in weights:
            problems.append(f"{name}: ternary weights need {scale}")
    if problems:
        raise _core.ShapeError(
            "checkpoint does not fit " + repr(config) + ":\n  " + "\n  ".join(problems)
        )


def projection(
    weights: Mapping[str, Any], prefix: str, shape: tuple[int, ...], config, device: Device
) -> TernaryWeights:
    """A projection as transformers computes it: BitLinear's packed values V with
    W = V / weight_scale; AutoBitLinear offline, ternary values (packed, int8 or float)
    with W = V * weight_scale; float weights (and AutoBitLinear online, any) quantized
    here, absmean per tensor, as AutoBitLinear's WeightQuant does."""
    w = np.asarray(weights[prefix + ".weight"])
    auto = config.linear_class == "autobitlinear"
    if w.dtype == np.uint8:
        w = unpack_hf_ternary(w, shape[0])
    if config.online:
        return quantize_weights(np.ascontiguousarray(w, np.float32), device=device)
    ternary = w.dtype == np.int8 or (auto and bool(np.isin(w, (-1, 0, 1)).all()))
    if auto and not ternary:
        raise _core.UnsupportedError(
            f"{prefix}.weight: AutoBitLinear's offline weights are ternary values here "
            "(transformers would run these float values unquantized)"
        )
    if ternary:
        if not np.isin(w, (-1, 0, 1)).all():
            raise _core.ArgumentError(f"{prefix}.weight: ternary values must be -1, 0 or 1")
        if prefix + ".weight_scale" not in weights:
            raise _core.ShapeError(f"{prefix}.weight: ternary weights need a weight_scale")
        scales = np.asarray(weights[prefix + ".weight_scale"])
        if scales.dtype.kind not in "iuf" or scales.size == 0:
            raise _core.ArgumentError(f"{prefix}.weight_scale: expected a real number")
        scale = float(scales.astype(np.float32).reshape(-1)[0])
        if not (np.isfinite(scale) and scale > 0):
            raise _core.ArgumentError(
                f"{prefix}.weight_scale must be positive and finite, got {scale}"
            )
        gamma = np.float32(scale if auto else 1.0 / scale)
        return TernaryWeights.from_packed(
            pack_values(w.astype(np.int8)), gamma, shape, device=device
        )
    if w.dtype not in (np.float32, np.float16):
        w = w.astype(np.float32)
    return quantize_weights(np.ascontiguousarray(w), device=device)


class WeightsAccess:
    """What a model holding `weights` (DecoderWeights) says of them: its tensors and their bytes."""

    weights: DecoderWeights

    @property
    def embed(self) -> Tensor:
        """The embedding table on the device."""
        return self.weights.embed

    @property
    def lm_head(self) -> Tensor:
        """The head on the device (the embedding where tied)."""
        return self.weights.lm_head

    @property
    def norm(self) -> Tensor:
        """The final norm's weight."""
        return self.weights.norm

    @property
    def layers(self) -> list[LayerWeights]:
        return self.weights.layers

    @property
    def nbytes(self) -> int:
        """Bytes of the weights on the device (packed projections, embedding, head, norms)."""
        return self.weights.nbytes

    @property
    def projection_nbytes(self) -> int:
        """Bytes of the packed ternary projections alone (what a decode step must read)."""
        return self.weights.projection_nbytes

    def reference_params(self) -> dict[str, Any]:
        """The parameters as NumPy (ternary values and gammas), for reference.bitnet_forward."""
        return self.weights.reference_params()

"""The decoder's sizes (``BitNetConfig``), read from a transformers config.json, and the names and
shapes of the tensors a checkpoint holds for them."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from .. import _core
from .._args import integer

__all__ = ["BitNetConfig", "PROJECTIONS", "NORMS", "layer_shapes", "weight_names"]

# (module path, short name) of the seven BitLinear projections of a layer.
PROJECTIONS = [
    ("self_attn.q_proj", "q"),
    ("self_attn.k_proj", "k"),
    ("self_attn.v_proj", "v"),
    ("self_attn.o_proj", "o"),
    ("mlp.gate_proj", "gate"),
    ("mlp.up_proj", "up"),
    ("mlp.down_proj", "down"),
]
NORMS = [
    "input_layernorm",
    "self_attn.attn_sub_norm",
    "post_attention_layernorm",
    "mlp.ffn_sub_norm",
]

_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)
# Every size a shader indexes with 32-bit integers, and no layer count that could not be loaded.
_MOST = {name: 2**31 - 1 for name in _SIZES} | {"num_hidden_layers": 4096}


@dataclasses.dataclass(frozen=True)
class BitNetConfig:
    """Sizes of a BitNet b1.58 decoder; field names as in transformers' BitNetConfig."""

    vocab_size: int = 128256
    hidden_size: int = 2560
    intermediate_size: int = 6912
    num_hidden_layers: int = 30
    num_attention_heads: int = 20
    num_key_value_heads: int = 5
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    tie_word_embeddings: bool = True
    # quantization_config's: "bitlinear" (packed weights W = values / weight_scale) or
    # "autobitlinear" (W = values * weight_scale offline; float weights quantized on load online).
    linear_class: str = "bitlinear"
    quantization_mode: str = "offline"

    def __post_init__(self) -> None:
        for name in _SIZES:
            value = integer(getattr(self, name), f"BitNetConfig.{name}")
            if not 0 < value <= _MOST[name]:
                raise _core.ArgumentError(
                    f"BitNetConfig.{name} must lie in [1, {_MOST[name]}], got {value}"
                )
            object.__setattr__(self, name, int(value))  # NumPy integers become Python ones
        for name, least in (("rms_norm_eps", 0.0), ("rope_theta", None)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise _core.ArgumentError(f"BitNetConfig.{name}: expected a number, got {value!r}")
            value = float(value)
            good = math.isfinite(value) and (value >= least if least is not None else value > 0)
            if not good:
                bound = ">= 0" if least is not None else "> 0"
                raise _core.ArgumentError(
                    f"BitNetConfig.{name} must be finite and {bound}, got {value}"
                )
            object.__setattr__(self, name, value)
        if not isinstance(self.tie_word_embeddings, bool):
            raise _core.ArgumentError(
                f"BitNetConfig.tie_word_embeddings: expected True or False, got "
                f"{self.tie_word_embeddings!r}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise _core.ArgumentError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise _core.ArgumentError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2 or self.head_dim > 256:
            raise _core.ArgumentError(f"head dim {self.head_dim} must be even and at most 256")
        if self.linear_class not in ("bitlinear", "autobitlinear"):
            raise _core.ArgumentError(
                f"BitNetConfig.linear_class: expected 'bitlinear' or 'autobitlinear', got "
                f"{self.linear_class!r}"
            )
        if self.quantization_mode not in ("offline", "online"):
            raise _core.ArgumentError(
                f"BitNetConfig.quantization_mode: expected 'offline' or 'online', got "
                f"{self.quantization_mode!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def online(self) -> bool:
        """AutoBitLinear's online mode: every projection quantized on load (absmean)."""
        return self.linear_class == "autobitlinear" and self.quantization_mode == "online"

    @classmethod
    def preset(cls, name: str, **changes: Any) -> BitNetConfig:
        """'tiny' (for tests), '2b4t' (microsoft/bitnet-b1.58-2B-4T), with any field changed."""
        presets: dict[str, dict[str, Any]] = {
            "2b4t": {},
            "tiny": dict(
                vocab_size=384,
                hidden_size=64,
                intermediate_size=176,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=256,
                rope_theta=10000.0,
            ),
        }
        if not isinstance(name, str) or name not in presets:
            raise _core.ArgumentError(
                f"unknown preset {name!r}: expected one of {', '.join(presets)}"
            )
        return cls(**{**presets[name], **changes})

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BitNetConfig:
        """From a transformers config.json dict, as transformers reads it: every key that changes
        the computation is honoured, wherever the transformers version that wrote it put it (RoPE's
        theta top-level or in rope_parameters), or refused with UnsupportedError naming it; keys
        that change nothing here (ids, dtypes, dropout, bookkeeping) are ignored. An absent
        tie_word_embeddings is False, transformers' default."""
        if not isinstance(values, dict):
            raise _core.ArgumentError(f"config: expected a dict, got {type(values).__name__}")

        def refuse(key: str, why: str) -> None:
            raise _core.UnsupportedError(f"config.json: {key} = {values.get(key)!r}: {why}")

        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in fields}
        kwargs.setdefault("tie_word_embeddings", False)
        rope = values.get("rope_parameters")
        if rope is not None:
            if not isinstance(rope, dict):
                refuse("rope_parameters", "expected a dict")
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                refuse("rope_parameters", "only the default RoPE runs here")
            if "rope_theta" in rope:
                kwargs["rope_theta"] = rope["rope_theta"]
        scaling = values.get("rope_scaling")
        if scaling is not None and (
            not isinstance(scaling, dict)
            or scaling.get("rope_type", scaling.get("type", "default")) != "default"
        ):
            refuse("rope_scaling", "only the default RoPE runs here")
        if values.get("hidden_act", "relu2") != "relu2":
            refuse("hidden_act", "BitNet's MLP here is relu(gate)^2 * up ('relu2')")
        for key in ("attention_bias", "mlp_bias"):
            if values.get(key, False):
                refuse(key, "the projections here have no bias")
        head_dim = values.get("head_dim")
        heads = values.get("num_attention_heads", cls.num_attention_heads)
        hidden = values.get("hidden_size", cls.hidden_size)
        if head_dim is not None:
            try:
                fits = head_dim * heads == hidden
            except TypeError:
                fits = False
            if not fits:
                refuse("head_dim", "heads here are hidden_size / num_attention_heads wide")
        quantization = values.get("quantization_config")
        if quantization is not None:
            if (
                not isinstance(quantization, dict)
                or quantization.get("quant_method", "bitnet") != "bitnet"
            ):
                refuse("quantization_config", "only BitNet's own quantization runs here")
            linear_class = quantization.get("linear_class", "bitlinear")
            mode = quantization.get("quantization_mode", "offline")
            if linear_class not in ("bitlinear", "autobitlinear"):
                refuse("quantization_config", "linear_class is 'bitlinear' or 'autobitlinear'")
            if mode not in ("offline", "online"):
                refuse("quantization_config", "quantization_mode is 'offline' or 'online'")
            if quantization.get("use_rms_norm", False):
                refuse("quantization_config", "BitLinear's extra input RMSNorm does not run here")
            kwargs["linear_class"], kwargs["quantization_mode"] = linear_class, mode
        return cls(**kwargs)

    def parameter_count(self) -> int:
        h, i, kv = self.hidden_size, self.intermediate_size, self.kv_size
        per_layer = h * (2 * h + 2 * kv) + 3 * h * i + 3 * h + i
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * per_layer + h + head


def layer_shapes(config: BitNetConfig) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    """({projection short name: (out, in)}, {norm: size}) of one layer."""
    h, i, kv = config.hidden_size, config.intermediate_size, config.kv_size
    projections = {
        "q": (h, h),
        "k": (kv, h),
        "v": (kv, h),
        "o": (h, h),
        "gate": (i, h),
        "up": (i, h),
        "down": (h, i),
    }
    norms = {norm: i if norm == "mlp.ffn_sub_norm" else h for norm in NORMS}
    return projections, norms


def weight_names(config: BitNetConfig) -> dict[str, tuple[int, ...]]:
    """{checkpoint name: shape} of every tensor the model needs (as float weights)."""
    h, v = config.hidden_size, config.vocab_size
    projections, norms = layer_shapes(config)
    names: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
    }
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        for module, short in PROJECTIONS:
            names[p + module + ".weight"] = projections[short]
        for norm, size in norms.items():
            names[p + norm + ".weight"] = (size,)
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = (v, h)
    return names

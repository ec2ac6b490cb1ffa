"""A BitNet b1.58 decoder (the 2B4T architecture) on the GPU, run as recorded graphs.

    config = BitNetConfig.preset("2b4t")
    model = BitNetModel.random(config, seed=0)                 # or BitNetModel.from_weights(...)
    logits = model.forward(token_ids)                          # [B, T, vocab] float32
    ids = model.generate(prompt, max_new_tokens=64)            # prompt + 64 new token ids

Architecture (transformers' BitNetForCausalLM): token embedding; per layer
    h = x + o_proj(attn_sub_norm(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))))
        with n = input_layernorm(x)
    x = h + down_proj(ffn_sub_norm(relu2(gate_proj(m)) * up_proj(m))),  m =
    post_attention_layernorm(h)
then norm and the (float) language-model head, tied to the embedding unless lm_head.weight is
given. Every projection is a BitLinear: per-token int8 activations times ternary weights
(docs/NUMERICS.md). RMSNorm eps and RoPE theta come from the config; attention is causal with
grouped-query heads and a KV cache on the device.

Each distinct step shape (batch, new tokens) is recorded once as a Graph; a decode step is one
queue submission that reads the token ids and the cache length from two small input tensors.
Decoding records up to decode_chunk steps in one graph, each step's ids (its argmax, or a draw
on the GPU at temperature > 0) feeding the next step there: one submission and one wait for
that many tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time

import numpy as np

from . import _core
from .norms import rms_norm
from .text import Tokenizer, load_generation_config, stream_pieces
from ._core import Tensor
from .attention import _half, rope_tables
from .checkpoint import load_safetensors
from .generation import SAMPLED, DecodeSession, GenerateOutput, _Context, is_ragged
from .graph import Graph
from ._args import _count, _integer
from .quantize import TernaryWeights, quantize_weights
from . import reference

__all__ = [
    "BitNetConfig",
    "BitNetModel",
    "DecodeSession",
    "GenerateOutput",
    "PROJECTIONS",
    "weight_names",
    "unpack_hf_ternary",
    "screening_tables",
]

_log = logging.getLogger("bitnet_gpu")

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
_NORMS = [
    "input_layernorm",
    "self_attn.attn_sub_norm",
    "post_attention_layernorm",
    "mlp.ffn_sub_norm",
]


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

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            value = _integer(getattr(self, name), f"BitNetConfig.{name}")
            if value <= 0:
                raise _core.ArgumentError(f"BitNetConfig.{name} must be positive, got {value}")
        if not (np.isfinite(self.rms_norm_eps) and self.rms_norm_eps >= 0):
            raise _core.ArgumentError(
                f"BitNetConfig.rms_norm_eps must be finite and >= 0, got {self.rms_norm_eps}"
            )
        if not (np.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise _core.ArgumentError(
                f"BitNetConfig.rope_theta must be finite and > 0, got {self.rope_theta}"
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

    @classmethod
    def preset(cls, name: str, **changes) -> "BitNetConfig":
        """'tiny' (for tests), '2b4t' (microsoft/bitnet-b1.58-2B-4T), with any field changed."""
        presets = {
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
        if name not in presets:
            raise _core.ArgumentError(
                f"unknown preset {name!r}: expected one of {', '.join(presets)}"
            )
        return cls(**{**presets[name], **changes})

    @classmethod
    def from_dict(cls, values: dict) -> "BitNetConfig":
        """From a transformers config.json dict, as transformers reads it: every key that changes
        the computation is honoured, wherever the transformers version that wrote it put it (RoPE's
        theta top-level or in rope_parameters), or refused with UnsupportedError naming it; keys
        that change nothing here (ids, dtypes, dropout, bookkeeping) are ignored. An absent
        tie_word_embeddings is False, transformers' default."""
        if not isinstance(values, dict):
            raise _core.ArgumentError(f"config: expected a dict, got {type(values).__name__}")

        def refuse(key, why):
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
        if head_dim is not None and head_dim * heads != values.get("hidden_size", cls.hidden_size):
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


def _layer_shapes(config: BitNetConfig):
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
    norms = {norm: i if norm == "mlp.ffn_sub_norm" else h for norm in _NORMS}
    return projections, norms


def weight_names(config: BitNetConfig) -> dict[str, tuple]:
    """{checkpoint name: shape} of every tensor the model needs (as float weights)."""
    h, v = config.hidden_size, config.vocab_size
    projections, norms = _layer_shapes(config)
    names = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        for module, short in PROJECTIONS:
            names[p + module + ".weight"] = projections[short]
        for norm, size in norms.items():
            names[p + norm + ".weight"] = (size,)
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = (v, h)
    return names


def unpack_hf_ternary(packed: np.ndarray, rows: int) -> np.ndarray:
    """int8 [rows, K] from transformers' packed BitNet weights uint8 [rows / 4, K]: row
    i * (rows / 4) + r holds bits 2i..2i+1 of packed row r, minus one."""
    packed = np.asarray(packed, np.uint8)
    quarter = packed.shape[0]
    out = np.empty((4 * quarter,) + packed.shape[1:], np.int8)
    for i in range(4):
        out[i * quarter : (i + 1) * quarter] = ((packed >> (2 * i)) & 3).astype(np.int8) - 1
    return out[:rows]


# The packed byte (docs/NUMERICS.md layout) of four ternary codes c0 + 3 c1 + 9 c2 + 27 c3.
_BYTE_OF_CODES = np.array(
    [sum(((n // 3**j) % 3) << (2 * j) for j in range(4)) for n in range(81)], np.uint8
)


def screening_tables(head, chunk_rows=4096):
    """The int8 copy of a float head [V, K] that ``_core.screened_argmax`` screens with: q int8
    [V, Kp] (K rounded up to 16, zero-padded), q_v = clip(rint(head[v] * (127 / m_v)), -127, 127)
    with m_v = max|head[v]| and sigma_v = float32(m_v / 127), and meta float32 [V, 4]: sigma_v;
    D' = D_v + gamma (N_v + D_v) and N_v, each bounded from above, where D_v = ||head[v] -
    sigma_v q_v||, N_v = ||head[v]|| and gamma = n u / (1 - n u) + 8 u, n = K + 64, u = 2^-24,
    bounds the float32 rounding of a K-term dot product in any order and of the screening's own
    products (shaders/screened_head/head_screen.comp has the bound). D_v and N_v are computed in
    float32
    and raised by what that rounding can hide: (1 + 2^-10) for a sum of K squares (K < 2^20), and
    1.02 sqrt(K) u m_v for the K differences. Rows with NaN or Inf, or whose largest value is below
    1e-15 (their squares could underflow), get D' = N = inf: never screened out."""
    head = np.asarray(head)
    if head.ndim != 2 or head.dtype not in (np.float16, np.float32):
        raise _core.ShapeError(
            f"head: expected float16 or float32 [V, K], got {head.dtype} {head.shape}"
        )
    v, k = head.shape
    if k >= 1 << 20:
        raise _core.ShapeError(f"head: rows of at most 2^20 values, got {k}")
    padded = -(-k // 16) * 16
    q = np.zeros((v, padded), np.int8)
    meta = np.zeros((v, 4), np.float32)
    u = 2.0**-24
    n = k + 64
    gamma = n * u / (1 - n * u) + 8 * u

    def rounded_up(values):
        single = values.astype(np.float32)
        return np.where(
            single.astype(np.float64) < values, np.nextafter(single, np.float32(np.inf)), single
        )

    def fill(first_chunk, chunk_step):
        rows_buffer = np.empty(
            (min(chunk_rows, v), k), np.float32
        )  # reused: no page faults a chunk
        work_buffer = np.empty_like(rows_buffer)
        for first in range(first_chunk * chunk_rows, v, chunk_step * chunk_rows):
            end = min(first + chunk_rows, v)
            rows, work = rows_buffer[: end - first], work_buffer[: end - first]
            rows[...] = head[first:end]
            with np.errstate(invalid="ignore", over="ignore"):
                amax = np.abs(rows, out=work).max(axis=1)
            bounded = np.isfinite(amax) & ((amax >= 1e-15) | (amax == 0))
            rows[~bounded] = 0.0
            amax = np.where(bounded, amax, np.float32(0))
            sigma = amax / np.float32(127)
            inverse = np.where(
                amax > 0, np.float32(127) / np.where(amax > 0, amax, np.float32(1)), np.float32(0)
            )
            values = np.multiply(rows, inverse[:, None], out=work)
            np.rint(values, out=values)
            np.clip(values, -127, 127, out=values)
            q[first:end, :k] = values
            error = np.multiply(values, sigma[:, None], out=values)
            np.subtract(rows, error, out=error)
            amax64 = amax.astype(np.float64)
            d = (
                np.sqrt(np.einsum("ij,ij->i", error, error, dtype=np.float32).astype(np.float64))
                * (1 + 2.0**-10)
                + 1.02 * math.sqrt(k) * u * amax64
            ) * (1 + 2.0**-20)
            norm = np.sqrt(
                np.einsum("ij,ij->i", rows, rows, dtype=np.float32).astype(np.float64)
            ) * (1 + 2.0**-10)
            meta[first:end, 0] = sigma
            meta[first:end, 1] = np.where(
                bounded, rounded_up(d + gamma * (norm + d)), np.float32(np.inf)
            )
            meta[first:end, 2] = np.where(bounded, rounded_up(norm), np.float32(np.inf))

    # Rows are independent: chunks dealt to threads (NumPy's loops release the GIL).
    threads = max(1, min(8, os.cpu_count() or 1, -(-v // chunk_rows)))
    if threads == 1:
        fill(0, 1)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(fill, t, threads) for t in range(threads)]:
                done.result()
    return q, meta


def _table_dtype(weights) -> np.dtype:
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
            return np.dtype(np.float32)  # checked and refused by _load
        narrowed = table.astype(np.float16)
        if not np.array_equal(narrowed.astype(table.dtype), table):
            return np.dtype(np.float32)
    return np.dtype(np.float16)


def _random_packed(rng, rows, cols):
    """Packed bytes of uniformly random ternary weights [rows, cols] (padding codes are zero)."""
    row_bytes = -(-cols // 16) * 4
    packed = _BYTE_OF_CODES[rng.integers(0, 81, size=(rows, row_bytes), dtype=np.uint8)]
    if cols % 4 or row_bytes * 4 != cols:
        values = reference.unpack_ternary(packed, (rows, row_bytes * 4))
        values[:, cols:] = 0
        packed = reference.pack_ternary(values[:, :cols])
    return packed


class _Layer:
    def __init__(self):
        self.proj = {}
        self.norms = {}


class BitNetModel:
    """BitNet b1.58 decoder on the GPU (see the module docstring). Build it with
    ``from_weights`` (a dict of arrays or a safetensors file, names as in transformers'
    BitNetForCausalLM) or ``random``."""

    def __init__(
        self,
        config: BitNetConfig,
        *,
        device=None,
        max_tokens=None,
        embedding_dtype=None,
        screened_head=None,
        decode_chunk=8,
        prefill_attention="float32",
    ):
        """embedding_dtype: float16 or float32 for the embedding and head; None: from_weights
        keeps what the checkpoint holds (float16 where that loses nothing), random weights float16.
        screened_head: decode steps of one sequence pick the next token through an int8 copy
        of the head (``_core.screened_argmax``, ``_core.screened_sample``: the same ids as the
        argmax of, or the draw from, the float head's logits, reading half the bytes; the copy
        takes vocab x hidden bytes more on the device).
        None: wherever the device takes the hidden size.
        decode_chunk: decode steps a graph replay runs at most (each step's next ids feed
        the next step's embedding on the GPU, so the host submits and waits once a chunk, and
        stream() yields a chunk's ids as it arrives); 1 replays the graph once a token.
        prefill_attention: "float32", or "float16": attention over more than 8 new tokens a
        sequence (prefill) with q, k, v and the weights rounded to float16 on tensor cores
        (bitnet_gpu.attention's precision; 4.3 times faster at 2048 tokens on the H100; the device
        feature "cooperative_matrix_khr_float16" and a head dim of 32 to 128, UnsupportedError
        otherwise). Decode steps keep float32."""
        from . import default_device

        self.config = config
        self.device = device or default_device()
        self.max_tokens = _count(
            config.max_position_embeddings if max_tokens is None else max_tokens, "max_tokens"
        )
        # from_weights chooses it from the checkpoint (_table_dtype); random weights take float16.
        self.embedding_dtype = np.dtype(np.float16 if embedding_dtype is None else embedding_dtype)
        if self.embedding_dtype not in (np.dtype(np.float16), np.dtype(np.float32)):
            raise _core.DTypeError(
                f"embedding_dtype: expected float16 or float32, got {self.embedding_dtype}"
            )
        self.layers = [_Layer() for _ in range(config.num_hidden_layers)]
        # Set by from_weights or random: the embedding, the head (the embedding where tied) and the
        # final norm's weight.
        self.embed: Tensor = None  # type: ignore[assignment]
        self.lm_head: Tensor = None  # type: ignore[assignment]
        self.norm: Tensor = None  # type: ignore[assignment]
        cos, sin = rope_tables(np.arange(self.max_tokens), config.head_dim, config.rope_theta)
        self._cos = Tensor.from_numpy(cos, self.device)
        self._sin = Tensor.from_numpy(sin, self.device)
        # A checkpoint directory's generation_config.json and tokenizer (from_weights).
        self.generation_config: dict = {}
        self._tokenizer_folder: str | None = None
        self._tokenizer: Tokenizer | None = None
        # The KV cache and recorded graphs of forward/generate/stream, one per batch size;
        # sessions (model.session()) hold their own.
        self._contexts: dict[int, _Context] = {}
        self._latest_graph: Graph | None = None
        self.load_summary = ""  # what from_weights loaded
        self.timings = False  # record graphs with per-op timestamps (benchmarks)
        fits = _core.screened_argmax_fits(self.device, config.hidden_size)
        if screened_head and not fits:
            raise _core.ArgumentError(
                f"screened_head: hidden size {config.hidden_size} does not fit screened_argmax "
                "on this device"
            )
        self.screened_head = fits if screened_head is None else bool(screened_head)
        self.decode_chunk = _count(decode_chunk, "decode_chunk")
        self._prefill_float16 = False
        self.prefill_attention = prefill_attention

    @property
    def prefill_attention(self) -> str:
        """ "float32" or "float16" (see __init__); setting it drops the recorded graphs."""
        return "float16" if self._prefill_float16 else "float32"

    @prefill_attention.setter
    def prefill_attention(self, precision) -> None:
        half = _half(precision)
        if half:
            # The op's own checks, on a query of this model's head shape.
            zero = Tensor.from_numpy(
                np.zeros((1, 1, self.config.head_dim), np.float32), self.device
            )
            _core.attention(zero, zero, zero, False, None, None, True)
        if half != self._prefill_float16:
            self._prefill_float16 = half
            self.reset_graphs()
        self._screening = (
            None  # (the head it copies, head_q, head_meta), built at the first screened step
        )

    # ----------------------------------------------------------------------------- weights
    @classmethod
    def from_weights(
        cls, weights, config: BitNetConfig | None = None, progress=None, **kwargs
    ) -> "BitNetModel":
        """weights: {name: array} or the path of a safetensors file or of a checkpoint directory
        (one file or shards with model.safetensors.index.json; config.json read from the
        directory, or beside a single file, unless `config` is given). Projections may be float
        matrices [out, in] (quantized on load: absmean, per tensor), transformers' packed uint8
        [out / 4, in] with a ``.weight_scale`` (W = values / weight_scale, as transformers'
        BitLinear), or int8 ternary values [out, in] with a ``.weight_scale`` in the same sense
        (AutoBitLinear checkpoints as transformers reads them: see _projection).
        progress: a progress bar on stderr while the layers load (None: for checkpoints over
        256 MiB where stderr is a terminal). The model's `load_summary` says what was loaded;
        it is also logged (logger "bitnet_gpu", INFO)."""
        begin = time.perf_counter()
        source = os.fspath(weights) if isinstance(weights, (str, os.PathLike)) else "arrays"
        folder, generation_config = None, {}
        if isinstance(weights, (str, os.PathLike)):
            path = os.fspath(weights)
            folder = path if os.path.isdir(path) else os.path.dirname(path)
            # config.json in the checkpoint's directory, or beside a single file.
            if config is None and os.path.exists(os.path.join(folder, "config.json")):
                import json

                with open(os.path.join(folder, "config.json")) as f:
                    config = BitNetConfig.from_dict(json.load(f))
            weights = load_safetensors(path)
            generation_config = load_generation_config(folder)
        if config is None:
            raise _core.ArgumentError("from_weights: pass a config (BitNetConfig.preset(...))")
        if "lm_head.weight" in weights and config.tie_word_embeddings:
            config = dataclasses.replace(config, tie_word_embeddings=False)
        if kwargs.get("embedding_dtype") is None:
            kwargs["embedding_dtype"] = _table_dtype(weights)
        model = cls(config, **kwargs)
        size = sum(getattr(w, "nbytes", 0) for w in weights.values())
        if progress is None:
            progress = size > 256 * 2**20 and sys.stderr.isatty()
        model._load(weights, bool(progress))
        if folder is not None:
            model.generation_config = generation_config
            model._tokenizer_folder = folder
        c = model.config
        model.load_summary = (
            f"loaded {source}: {c.num_hidden_layers} layers, {c.parameter_count() / 1e9:.2f} B "
            f"parameters ({c.linear_class}, {c.quantization_mode}), embedding and head "
            f"{model.embedding_dtype}{' (tied)' if c.tie_word_embeddings else ''}, "
            f"{model.nbytes / 2**30:.2f} GiB on {model.device.name} in "
            f"{time.perf_counter() - begin:.1f} s"
        )
        _log.info(model.load_summary)
        return model

    @classmethod
    def from_pretrained(cls, path, **kwargs) -> "BitNetModel":
        """A checkpoint directory in the Hugging Face layout (config.json, model.safetensors or
        shards with their index, tokenizer.json, tokenizer_config.json, generation_config.json),
        as from_weights(path) reads it; keyword arguments as the constructor takes them."""
        folder = os.fspath(path)
        if not os.path.isdir(folder):
            raise _core.ArgumentError(f"from_pretrained: {folder} is not a checkpoint directory")
        if not os.path.exists(os.path.join(folder, "config.json")):
            raise _core.ArgumentError(f"from_pretrained: {folder} has no config.json")
        return cls.from_weights(folder, **kwargs)

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The checkpoint's tokenizer (tokenizer.json, tokenizer_config.json), read on first use,
        or None where the model came from elsewhere or the directory has none."""
        if self._tokenizer is None and self._tokenizer_folder is not None:
            self._tokenizer = Tokenizer.from_directory(self._tokenizer_folder)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Tokenizer | None) -> None:
        self._tokenizer = tokenizer
        self._tokenizer_folder = None

    def _end_ids(self, eos_token_id) -> list[int]:
        """The ids that end a sequence: eos_token_id (an id or a list of them), else
        generation_config.json's."""
        if eos_token_id is None:
            return list(self.generation_config.get("eos_token_id") or [])
        ids = [eos_token_id] if np.ndim(eos_token_id) == 0 else list(eos_token_id)
        return [_integer(i, "eos_token_id") for i in ids]

    @classmethod
    def random(cls, config: BitNetConfig, seed=0, **kwargs) -> "BitNetModel":
        """Random ternary weights (uniform over {-1, 0, 1}, gamma = 1 / sqrt(in_features)),
        embedding N(0, 1), norm weights near one: for tests and benchmarks."""
        model = cls(config, **kwargs)
        rng = np.random.default_rng(seed)
        h = config.hidden_size
        model.embed = Tensor.from_numpy(
            rng.standard_normal((config.vocab_size, h), np.float32).astype(model.embedding_dtype),
            model.device,
        )
        model.lm_head = (
            model.embed
            if config.tie_word_embeddings
            else Tensor.from_numpy(
                (
                    rng.standard_normal((config.vocab_size, h), np.float32)
                    / np.float32(math.sqrt(h))
                ).astype(model.embedding_dtype),
                model.device,
            )
        )
        model.norm = Tensor.from_numpy(
            (1 + 0.1 * rng.standard_normal(h)).astype(np.float32), model.device
        )
        projections, norms = _layer_shapes(config)
        for layer in model.layers:
            for short, (rows, cols) in projections.items():
                packed = _random_packed(rng, rows, cols)
                scale = np.array([1.0 / math.sqrt(cols)], np.float32)
                layer.proj[short] = TernaryWeights(
                    _core.weights_from_packed(
                        Tensor.from_numpy(packed, model.device),
                        Tensor.from_numpy(scale, model.device),
                        rows,
                        cols,
                        0,
                        False,
                    )
                )
            for norm, size in norms.items():
                layer.norms[norm] = Tensor.from_numpy(
                    (1 + 0.1 * rng.standard_normal(size)).astype(np.float32), model.device
                )
        return model

    def _load(self, weights, progress=False):
        expected = weight_names(self.config)
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
            if got != shape and not is_packed:
                problems.append(f"{name}: expected shape {shape}, got {got}")
            elif (
                kind in (np.uint8, np.int8)
                and not self._online
                and name.replace(".weight", ".weight_scale") not in weights
            ):
                problems.append(
                    f"{name}: ternary weights need {name.replace('.weight', '.weight_scale')}"
                )
        if problems:
            raise _core.ShapeError(
                "checkpoint does not fit " + repr(self.config) + ":\n  " + "\n  ".join(problems)
            )
        dev = self.device
        self.embed = Tensor.from_numpy(
            np.asarray(weights["model.embed_tokens.weight"]).astype(self.embedding_dtype), dev
        )
        self.lm_head = (
            self.embed
            if self.config.tie_word_embeddings
            else Tensor.from_numpy(
                np.asarray(weights["lm_head.weight"]).astype(self.embedding_dtype), dev
            )
        )
        self.norm = Tensor.from_numpy(np.asarray(weights["model.norm.weight"], np.float32), dev)
        layers = enumerate(self.layers)
        if progress:
            from tqdm import tqdm  # type: ignore[import-untyped]

            layers = tqdm(layers, "loading layers", len(self.layers), unit="layer", file=sys.stderr)
        for index, layer in layers:
            p = f"model.layers.{index}."
            for module, short in PROJECTIONS:
                layer.proj[short] = self._projection(
                    weights, p + module, expected[p + module + ".weight"]
                )
            for norm in _NORMS:
                layer.norms[norm] = Tensor.from_numpy(
                    np.asarray(weights[p + norm + ".weight"], np.float32), dev
                )

    @property
    def _online(self) -> bool:
        """AutoBitLinear's online mode: every projection quantized on load (absmean)."""
        c = self.config
        return c.linear_class == "autobitlinear" and c.quantization_mode == "online"

    def _projection(self, weights, prefix, shape) -> TernaryWeights:
        """A projection as transformers computes it: BitLinear's packed values V with
        W = V / weight_scale; AutoBitLinear offline, ternary values (packed, int8 or float)
        with W = V * weight_scale; float weights (and AutoBitLinear online, any) quantized
        here, absmean per tensor, as AutoBitLinear's WeightQuant does."""
        w = np.asarray(weights[prefix + ".weight"])
        auto = self.config.linear_class == "autobitlinear"
        if w.dtype == np.uint8:
            w = unpack_hf_ternary(w, shape[0])
        if self._online:
            return quantize_weights(np.ascontiguousarray(w, np.float32), device=self.device)
        ternary = w.dtype == np.int8 or (auto and np.isin(w, (-1, 0, 1)).all())
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
            scale = float(np.asarray(weights[prefix + ".weight_scale"], np.float32).reshape(-1)[0])
            if not (np.isfinite(scale) and scale > 0):
                raise _core.ArgumentError(
                    f"{prefix}.weight_scale must be positive and finite, got {scale}"
                )
            gamma = np.float32(scale if auto else 1.0 / scale)
            return TernaryWeights.from_packed(
                reference.pack_ternary(w.astype(np.int8)), gamma, shape, device=self.device
            )
        if w.dtype not in (np.float32, np.float16):
            w = w.astype(np.float32)
        return quantize_weights(np.ascontiguousarray(w), device=self.device)

    @property
    def nbytes(self) -> int:
        """Bytes of the weights on the device (packed projections, embedding, head, norms)."""
        total = self.embed.nbytes + self.norm.nbytes
        if self.lm_head is not self.embed:
            total += self.lm_head.nbytes
        for layer in self.layers:
            total += sum(w.nbytes for w in layer.proj.values())
            total += sum(t.nbytes for t in layer.norms.values())
        return total

    @property
    def screening_nbytes(self) -> int:
        """Bytes of the head's int8 screening copy (0 until a decode step has built it)."""
        return sum(t.nbytes for t in self._screening[1:]) if self._screening else 0

    def prepare_screened_head(self):
        """Builds the head's int8 screening copy now (a decode step builds it when first needed:
        NumPy over the whole head, seconds for the 2B4T vocabulary); nothing if screened_head is
        off."""
        if self.screened_head:
            self._screening_tensors()

    def _screens(self, batch, logits):
        """Whether a step's graph picks the next id through the screened head (its graph key
        too)."""
        return logits in ("next", "sample", "nucleus_top_k") and batch == 1 and self.screened_head

    def _screening_tensors(self):
        if self._screening is None or self._screening[0] is not self.lm_head:
            q, meta = screening_tables(self.lm_head.numpy())
            self._screening = (
                self.lm_head,
                Tensor.from_numpy(q, self.device),
                Tensor.from_numpy(meta, self.device),
            )
        return self._screening[1:]

    @property
    def projection_nbytes(self) -> int:
        """Bytes of the packed ternary projections alone (what a decode step must read)."""
        return sum(w.nbytes for layer in self.layers for w in layer.proj.values())

    def reference_params(self) -> dict:
        """The model's parameters as NumPy (ternary values and gammas), for
        reference.bitnet_forward."""
        layers = []
        for layer in self.layers:
            layers.append(
                {
                    "proj": {
                        k: (w.unpack(), float(np.asarray(w.scale).reshape(-1)[0]))
                        for k, w in layer.proj.items()
                    },
                    "norms": {k: t.numpy() for k, t in layer.norms.items()},
                }
            )
        return {
            "embed": self.embed.numpy().astype(np.float32),
            "lm_head": self.lm_head.numpy().astype(np.float32),
            "norm": self.norm.numpy(),
            "layers": layers,
        }

    # ----------------------------------------------------------------------------- running
    def _context(self, batch) -> "_Context":
        """The KV cache and graphs forward/generate/stream use for `batch` sequences."""
        if batch not in self._contexts:
            self._contexts[batch] = _Context(self, batch)
        return self._contexts[batch]

    def _new_cache(self, batch):
        c = self.config
        shape = (batch, self.max_tokens, c.num_key_value_heads, c.head_dim)
        return [
            (self.device.empty(shape, np.float32), self.device.empty(shape, np.float32))
            for _ in self.layers
        ]

    @property
    def cache_nbytes(self) -> int:
        """Bytes of the KV caches forward/generate/stream hold (sessions hold their own)."""
        return sum(context.cache_nbytes for context in self._contexts.values())

    def _record(self, caches, batch, tokens, logits, split_keys=0, steps=1, logits_output=False):
        """Records one step of `tokens` new tokens for `batch` sequences over `caches` (input
        'start', int32 [batch]: the tokens each sequence has cached before these). A step of
        several tokens (a prefill) takes inputs 'last' (int32 [batch]: the row of each sequence's
        last token in the step's rows, for a sequence of fewer tokens than the step padded after
        them) and 'drawn_at' (int32 [batch]: the position of the token a draw picks).
        logits: 'last' (each sequence's last token, and its argmax), 'all', 'next' (the argmax
        alone: through the screened head for one sequence where screened_head, else as 'last'),
        'sample' (as 'next', the ids drawn, by sample_rows or for one sequence screened_sample,
        with input 'sampling', uint32 [6]: sampling._sampling_params'; the draw of the token at
        position
        p is keyed by step p), 'nucleus' (as 'sample' with top-p: the nucleus passes too, after
        the float16 head) or 'nucleus_top_k' (the same with top_k set: for one sequence through the
        screened head, whose top-k candidates hold every row top-p can keep. Without top_k they
        are the rows within 22.5 t of the largest logit, which for a trained model's logits, a few
        units apart, is most of the vocabulary: slower than the float16 head, docs/PERFORMANCE.md).
        split_keys: the keys a decode attention workgroup takes (0: its default).
        steps > 1 (decode, 'next'): that many steps in a row, step i after start_i cached tokens
        (inputs 'start', 'start1', ...), each taking the ids the step before picked as its input,
        its own picked in output 'next' (step 0) or 'next<i>'.
        logits_output: each step's logits (float32 [batch, vocab], [batch * tokens, vocab] for
        'all') as output 'logits' (step 0) or 'logits<i>', through the float head; 'all' and
        'last' always give them."""
        logits_output = logits_output or logits in ("all", "last")
        graph = Graph(self.device, timings=self.timings)
        with graph:
            ids = graph.input("ids", (batch * tokens,), np.int32)
            sampling = graph.input("sampling", (6,), np.uint32) if logits in SAMPLED else None
            gather = drawn_at = None
            if tokens > 1 and logits != "all":
                gather = graph.input("last", (batch,), np.int32)
                drawn_at = graph.input("drawn_at", (batch,), np.int32)
            for step in range(steps):
                start = graph.input("start" if step == 0 else f"start{step}", (batch,), np.int32)
                ids, out = self._record_step(
                    caches,
                    ids,
                    start,
                    batch,
                    tokens,
                    logits,
                    split_keys,
                    logits_output,
                    sampling,
                    gather,
                    drawn_at,
                )
                if out is not None:
                    graph.output("logits" if step == 0 else f"logits{step}", out)
                if ids is not None:
                    graph.output("next" if step == 0 else f"next{step}", ids)
        return graph

    def _record_step(
        self,
        caches,
        ids,
        start,
        batch,
        tokens,
        logits,
        split_keys,
        logits_output,
        sampling=None,
        gather=None,
        drawn_at=None,
    ):
        """The ops of one step (see _record): returns its next ids (int32 [batch], in host memory:
        reading them back is a memcpy, not a second submission; None for 'all') and its logits
        (None unless logits_output)."""
        c = self.config
        rows = batch * tokens
        eps = c.rms_norm_eps
        x = _core.embedding(self.embed, ids)
        for layer, (k_cache, v_cache) in zip(self.layers, caches):
            w, norms = layer.proj, layer.norms
            # norm + int8 pre-pass once, then q, k and v (bitlinear_group fuses them).
            q, k, v = _core.bitlinear_group(
                x,
                None,
                norms["input_layernorm"],
                eps,
                [w["q"]._core, w["k"]._core, w["v"]._core],
                [None] * 3,
            )
            kv_shape = (rows, c.num_key_value_heads, c.head_dim)
            q, k, v = (
                q.reshape(rows, c.num_attention_heads, c.head_dim),
                k.reshape(*kv_shape),
                v.reshape(*kv_shape),
            )
            if tokens == 1:  # decode: RoPE, the cache append and attention in one dispatch
                a = _core.decode_attention(
                    q, k, v, self._cos, self._sin, start, k_cache, v_cache, split_keys
                )
            else:
                q = _core.rope_append(q, k, v, self._cos, self._sin, start, k_cache, v_cache)
                a = _core.attention_cached(
                    q, k_cache, v_cache, start, True, None, self._prefill_float16 and tokens > 8
                )
            (x,) = _core.bitlinear_group(
                a.reshape(rows, c.hidden_size),
                None,
                norms["self_attn.attn_sub_norm"],
                eps,
                [w["o"]._core],
                [x],
            )
            if tokens == 1:  # decode: the gate/up dispatch writes relu(gate)^2 * up itself
                (f,) = _core.bitlinear_group(
                    x,
                    None,
                    norms["post_attention_layernorm"],
                    eps,
                    [w["gate"]._core, w["up"]._core],
                    [None, None],
                    True,
                )
                (x,) = _core.bitlinear_group(
                    f, None, norms["mlp.ffn_sub_norm"], eps, [w["down"]._core], [x]
                )
            else:
                g, u = _core.bitlinear_group(
                    x,
                    None,
                    norms["post_attention_layernorm"],
                    eps,
                    [w["gate"]._core, w["up"]._core],
                    [None, None],
                )
                (x,) = _core.bitlinear_group(
                    g, u, norms["mlp.ffn_sub_norm"], eps, [w["down"]._core], [x]
                )
        x = rms_norm(x, self.norm, eps)
        if gather is not None:
            x = _core.embedding(x, gather)  # each sequence's last row
        if self._screens(batch, logits) and not logits_output:
            head_q, head_meta = self._screening_tensors()
            picked = self.device.empty((1,), np.int32, memory="host")
            if logits in SAMPLED:  # the drawn token's position is its step
                drawn = _core.screened_sample(
                    x,
                    self.lm_head,
                    head_q,
                    head_meta,
                    sampling,
                    start if drawn_at is None else drawn_at,
                    1 if drawn_at is None else 0,
                    picked,
                    None,
                    logits != "sample",
                )
                return drawn, None
            return _core.screened_argmax(x, self.lm_head, head_q, head_meta, picked), None
        out = _core.linear_rows(x, self.lm_head)
        kept = out if logits_output else None
        if logits == "all":
            return None, kept
        if logits in SAMPLED:  # the drawn token's position is its step
            drawn = _core.sample_rows(
                out,
                sampling,
                start if drawn_at is None else drawn_at,
                1 if drawn_at is None else 0,
                self.device.empty((batch,), np.int32, memory="host"),
                logits != "sample",
            )
            return drawn, kept
        return _core.argmax_rows(out, self.device.empty((batch,), np.int32, memory="host")), kept

    # Prefill graphs hold their intermediates (hundreds of MB for long prompts): only the most
    # recent few are kept; decode graphs (one token a sequence) are kept for every batch size.
    KEPT_PREFILL_GRAPHS = 2
    # A decode step's attention takes 16 keys a workgroup while the context is at most
    # SHORT_DECODE_CONTEXT tokens, 32 up to LONG_DECODE_CONTEXT and 64 beyond (one recorded decode
    # graph for each): smaller splits fill the GPU at short contexts, larger ones keep the merge to
    # one chunk and the workgroups to one round at long ones (docs/PERFORMANCE.md).
    SHORT_DECODE_CONTEXT = 384
    LONG_DECODE_CONTEXT = 640

    def _split_keys(self, tokens, start):
        """The keys a decode attention workgroup takes for a step after `start` cached tokens."""
        context = start + 1
        return (
            0
            if tokens > 1
            else 16
            if context <= self.SHORT_DECODE_CONTEXT
            else 32
            if context <= self.LONG_DECODE_CONTEXT
            else 64
        )

    def _chunk(self, start, remaining):
        """Decode steps the next replay runs from `start` cached tokens, `remaining` wanted:
        decode_chunk, else (fewer wanted, or the attention's split changing within the chunk, which
        must not change a step's graph) the largest power of two that fits."""
        most = min(self.decode_chunk, remaining)
        split = self._split_keys(1, start)
        steps = 1
        while steps < most and self._split_keys(1, start + steps) == split:
            steps += 1
        return steps if steps == self.decode_chunk else 1 << (steps.bit_length() - 1)

    def session(self, batch=1) -> DecodeSession:
        """A KV cache of its own for `batch` sequences (vocab-free: batch x max_tokens x layers
        x 2 x kv heads x head dim float32, allocated at the first step), fed and read through
        DecodeSession.step, forward, stream and generate: the public decode-step API."""
        return DecodeSession(self, batch)

    def _fresh(self, token_ids, attention_mask=None) -> DecodeSession:
        """An empty session over the model's own cache for the batch token_ids hold."""
        if is_ragged(token_ids):
            batch = len(token_ids)
        else:
            shape = np.shape(token_ids)
            if len(shape) not in (1, 2) or 0 in shape:
                raise _core.ShapeError(
                    f"token_ids: expected [T] or [B, T] with B, T > 0, got shape {shape}"
                )
            batch = 1 if len(shape) == 1 else shape[0]
        if batch == 0:
            raise _core.ShapeError("token_ids: no sequences")
        return DecodeSession(self, batch, self._context(batch))

    def forward(self, token_ids, attention_mask=None) -> np.ndarray:
        """logits float32 [B, T, vocab] (or [T, vocab] for 1-D token_ids) of a prefill from an
        empty cache; the model's cache then holds these tokens. With an attention_mask
        (1: token, 0: padding before or after a sequence's tokens) each sequence is computed
        alone, from position 0, and padding's rows are zeros; a list of sequences of different
        lengths works the same way."""
        return self._fresh(token_ids).forward(token_ids, attention_mask)

    def stream(
        self,
        token_ids,
        max_new_tokens,
        temperature=0.0,
        top_k=None,
        seed=0,
        eos_token_id=None,
        top_p=None,
        attention_mask=None,
        pad_token_id=None,
    ):
        """Yields the next token ids (int32 [B]) one step at a time: a prefill of the prompt, then
        one graph replay per decode_chunk tokens (yielded together as the replay ends).
        token_ids: [T], [B, T] (with an optional attention_mask: 1 for a token, 0 for padding
        before or after it) or a list of B sequences of any lengths; each sequence takes its own
        positions, as alone. temperature 0 is greedy (argmax on the GPU); otherwise each token is
        drawn on the GPU from softmax(logits / temperature) over the top_k largest logits (every
        one at least the top_k-th largest; all if None) and, with top_p in (0, 1), of those the
        smallest set of the largest holding that share of the probability (nucleus sampling), as
        bitnet_gpu.sample_logits draws with `seed`, the row's index and the token's position in
        its sequence as its step: the same call draws the same tokens however it is chunked.
        Generation stops when every sequence has produced an end id (eos_token_id, one or a
        list, else generation_config.json's); a finished sequence then takes pad_token_id (else
        generation_config.json's, else the first end id)."""
        return self._fresh(token_ids).stream(
            token_ids,
            max_new_tokens,
            temperature,
            top_k,
            seed,
            eos_token_id,
            top_p,
            attention_mask,
            pad_token_id,
        )

    def generate(
        self,
        token_ids,
        max_new_tokens,
        temperature=0.0,
        top_k=None,
        seed=0,
        eos_token_id=None,
        callback=None,
        top_p=None,
        attention_mask=None,
        pad_token_id=None,
        output_logits=False,
        output_scores=False,
        return_dict_in_generate=False,
    ):
        """The prompt followed by up to max_new_tokens generated ids ([T + n], [B, T + n] with
        the prompt's padding kept, or for a list of sequences a list of arrays); see stream.
        callback(step, ids [B]) is called as each token arrives (streaming).
        return_dict_in_generate: a GenerateOutput (sequences, and with output_logits each step's
        logits, with output_scores each step's logits as the draw saw them), as transformers."""
        return self._fresh(token_ids).generate(
            token_ids,
            max_new_tokens,
            temperature,
            top_k,
            seed,
            eos_token_id,
            callback,
            top_p,
            attention_mask,
            pad_token_id,
            output_logits,
            output_scores,
            return_dict_in_generate,
        )

    def _text_prompt(self, prompt) -> np.ndarray:
        """The ids of a text prompt (encoded with the special tokens the tokenizer adds) or of a
        conversation ([{"role": ..., "content": ...}], through the chat template, ready for the
        assistant's turn)."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise _core.ArgumentError(
                "this model has no tokenizer: load a checkpoint directory holding tokenizer.json, "
                "or set model.tokenizer"
            )
        ids: list[int] | str
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        else:
            raise TypeError("prompt: expected a str or a list of {'role', 'content'} messages")
        if not ids:
            raise _core.ArgumentError("prompt: the text encodes to no tokens")
        return np.array(ids, np.int64)

    def _sampling_defaults(self, temperature, top_k, top_p):
        """generation_config.json's sampling where the call leaves it unset (greedy without it)."""
        config = self.generation_config
        sampled = bool(config.get("do_sample"))
        if temperature is None:
            temperature = float(config.get("temperature", 1.0)) if sampled else 0.0
        if top_k is None and sampled:
            top_k = config.get("top_k") or None
        if top_p is None and sampled:
            top_p = config.get("top_p")
        return temperature, top_k, top_p

    def stream_text(
        self,
        prompt,
        max_new_tokens=256,
        temperature=None,
        top_k=None,
        top_p=None,
        seed=0,
        eos_token_id=None,
        callback=None,
        session: DecodeSession | None = None,
    ):
        """Yields the generated text in pieces as tokens arrive, never a broken UTF-8 character,
        until an end id (eos_token_id, else generation_config.json's) or max_new_tokens. prompt:
        text, or a conversation of messages rendered by the chat template. Unset sampling settings
        come from generation_config.json (greedy without one). callback(step, id) is called as
        each token arrives, the end id too. session: a DecodeSession of one sequence to go on
        with, as a chat does: where the prompt's ids begin with the ones the session holds (the
        conversation so far, the reply's end id included), only the rest is fed; otherwise the
        session starts again from the whole prompt."""
        ids = self._text_prompt(prompt)
        tokenizer = self.tokenizer
        assert tokenizer is not None  # _text_prompt raised otherwise
        temperature, top_k, top_p = self._sampling_defaults(temperature, top_k, top_p)
        ends = set(self._end_ids(eos_token_id))
        if session is None:
            session = self._fresh(ids)
        else:
            if session.model is not self or session.batch != 1:
                raise _core.ArgumentError("session: expected a session of this model's, batch 1")
            held = session.token_ids[0]
            if len(held) <= len(ids) and np.array_equal(held, ids[: len(held)]):
                ids = ids[len(held) :]
            else:
                session.reset()

        def new_ids():
            for step, chosen in enumerate(
                session.stream(ids, max_new_tokens, temperature, top_k, seed, eos_token_id, top_p)
            ):
                token = int(chosen[0])
                if callback is not None:
                    callback(step, token)
                if token in ends:
                    return
                yield token

        yield from stream_pieces(tokenizer, new_ids())

    def generate_text(
        self,
        prompt,
        max_new_tokens=256,
        temperature=None,
        top_k=None,
        top_p=None,
        seed=0,
        eos_token_id=None,
    ) -> str | list[str]:
        """The text generated after `prompt` (see stream_text), without the end token. A list of
        prompts (texts or conversations) runs as one batch of different lengths and gives a list
        of texts, sequence b's draws keyed by its index b."""
        batch = isinstance(prompt, (list, tuple)) and all(
            isinstance(p, str) or (isinstance(p, (list, tuple)) and p) for p in prompt
        )
        if not batch or not prompt:
            return "".join(
                self.stream_text(
                    prompt, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id
                )
            )
        prompts = [self._text_prompt(p) for p in prompt]
        tokenizer = self.tokenizer
        assert tokenizer is not None  # _text_prompt raised otherwise
        temperature, top_k, top_p = self._sampling_defaults(temperature, top_k, top_p)
        ends = set(self._end_ids(eos_token_id))
        out = self.generate(prompts, max_new_tokens, temperature, top_k, seed, eos_token_id)
        texts = []
        for ids, sequence in zip(prompts, out):
            new = [int(t) for t in sequence[len(ids) :]]
            stop = next((i for i, t in enumerate(new) if t in ends), len(new))
            texts.append("".join(stream_pieces(tokenizer, iter(new[:stop]))))
        return texts

    def _replay(self, ids, start, mode):
        """One step of ids int32 [B, T] after `start` cached tokens over the model's own cache
        (benchmarks time it): the graph's outputs."""
        batch, tokens = ids.shape
        return self._context(batch).run(
            ids, np.full(batch, start, np.int64), np.full(batch, tokens, np.int64), mode
        )

    def _graph_keys(self) -> list[tuple]:
        """(batch, tokens, logits, split, screened, steps, logits_output) of each recorded graph
        of forward/generate/stream (tests and benchmarks)."""
        return [(b,) + key for b, context in self._contexts.items() for key in context.graphs]

    def reset_graphs(self):
        """Drops the recorded graphs of forward/generate/stream (recorded again on the next
        call)."""
        for context in self._contexts.values():
            context.graphs.clear()

    def __repr__(self):
        c = self.config
        return (
            f"<bitnet_gpu.models.BitNetModel layers={c.num_hidden_layers} hidden={c.hidden_size} "
            f"vocab={c.vocab_size} max_tokens={self.max_tokens} nbytes={self.nbytes}>"
        )

"""BitNetModel: the decoder's user surface (from_pretrained, random, generate, stream,
generate_text, stream_text, session, forward). What runs underneath is in the package's other
modules: config, weights and the checkpoint, the screened head, steps and their graphs, cache
slots, sessions and generation."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .. import _core
from .._args import count, float_dtype, seed_value
from .._core import Device
from .._core import default_device as _default_device
from ..text import Tokenizer
from .config import BitNetConfig
from .loading import checkpoint_directory, read_checkpoint
from .generation import (
    GenerationOptions,
    batch_of,
    generate_ids,
    generation_method,
    session_for,
    stream_ids,
)
from .recording import RecordedStep
from .runner import StepRunner
from .session import DecodeSession
from .step import DecodePolicy, StepPlan
from .text_generation import generate_text, stream_text
from .weights import DecoderWeights, WeightsAccess, table_dtype

__all__ = ["BitNetModel"]

_log = logging.getLogger("bitnet_gpu")


class BitNetModel(WeightsAccess):
    """BitNet b1.58 decoder on the GPU (transformers' BitNetForCausalLM). Build it with
    ``from_pretrained`` (a checkpoint directory), ``from_weights`` (a dict of arrays or a
    safetensors file, names as in transformers) or ``random``. Each distinct step shape is recorded
    once as a graph and replayed: a decode step is one queue submission."""

    def __init__(
        self,
        config: BitNetConfig,
        *,
        device: Device | None = None,
        max_tokens: int | None = None,
        embedding_dtype: Any = None,
        screened_head: bool | None = None,
        decode_chunk: int = 8,
        prefill_attention: str = "float32",
        kv_cache_dtype: Any = "float32",
        weights: DecoderWeights | None = None,
    ) -> None:
        """embedding_dtype: float16 or float32 for the embedding and head; None: from_weights
        keeps what the checkpoint holds (float16 where that loses nothing), random weights float16.
        screened_head: decode steps pick the next token (the argmax or draw of one sequence, of
        several, or of a verify step's tokens; not top-p without top-k) through an int8 copy of
        the head (``_core.screened_argmax``, ``_core.screened_sample``: the same ids as the argmax
        of, or the draw from, the float head's logits, reading half the bytes; the copy takes
        vocab x hidden bytes more on the device). None: wherever the device takes the hidden
        size. decode_chunk: decode steps a graph replay runs at most (each step's next ids feed
        the next step's embedding on the GPU, so the host submits and waits once a chunk, and
        stream() yields a chunk's ids as it arrives); 1 replays the graph once a token.
        prefill_attention: "float32", or "float16": attention over more than 8 new tokens a
        sequence (prefill) with q, k, v and the weights rounded to float16 on tensor cores
        (bitnet_gpu.attention's precision; the device feature "cooperative_matrix_khr_float16"
        and a head dim of 32 to 128, UnsupportedError otherwise). Decode steps keep float32.
        kv_cache_dtype: "float32", or "float16": keys and values kept rounded to float16 (half
        the memory; attention computes in float32 from them, docs/NUMERICS.md).
        weights: the parameters (from_weights and random pass them; None: random ones, seed 0)."""
        if not isinstance(config, BitNetConfig):
            raise TypeError(f"config: expected a BitNetConfig, got {type(config).__name__}")
        self.config = config
        self.device = device or _default_device()
        self.max_tokens = count(
            config.max_position_embeddings if max_tokens is None else max_tokens, "max_tokens"
        )
        if self.max_tokens >= 2**31:
            raise _core.ArgumentError(f"max_tokens: expected less than 2**31, got {max_tokens}")
        self.embedding_dtype = _table_dtype(embedding_dtype)
        if weights is None:
            weights = DecoderWeights.random(config, 0, self.embedding_dtype, self.device)
        self.weights = weights
        self.runner = StepRunner.build(
            config,
            weights,
            self.max_tokens,
            screened_head,
            count(decode_chunk, "decode_chunk"),
            float_dtype(kv_cache_dtype, "kv_cache_dtype"),
        )
        self.screening = self.runner.recorder.screened_head
        self.prefill_attention = prefill_attention
        # A checkpoint directory's generation_config.json and tokenizer (from_weights).
        self.generation_config: dict = {}
        self._tokenizer_folder: str | None = None
        self._tokenizer: Tokenizer | None = None
        self.load_summary = ""  # what from_weights loaded

    # ------------------------------------------------------------------------- settings
    @property
    def prefill_attention(self) -> str:
        """ "float32" or "float16" (see __init__)."""
        return "float16" if self.runner.float16_prefill else "float32"

    @prefill_attention.setter
    def prefill_attention(self, precision: str) -> None:
        self.runner.set_prefill_precision(precision)

    @property
    def kv_cache_dtype(self) -> np.dtype:
        """The KV caches' dtype: float32 or float16 (set when the model is made)."""
        return self.runner.kv_dtype

    @property
    def screened_head(self) -> bool:
        """Whether decode steps pick through the screened head (see __init__)."""
        return self.runner.screened_head

    @screened_head.setter
    def screened_head(self, on: bool) -> None:
        self.runner.screened_head = bool(on)

    @property
    def policy(self) -> DecodePolicy:
        """The graph shapes' choices: decode_chunk, the attention splits, prefill graphs kept."""
        return self.runner.policy

    @policy.setter
    def policy(self, policy: DecodePolicy) -> None:
        self.runner.replace_policy(policy)

    @property
    def decode_chunk(self) -> int:
        return self.runner.policy.decode_chunk

    @decode_chunk.setter
    def decode_chunk(self, steps: int) -> None:
        self.policy = dataclasses.replace(self.policy, decode_chunk=count(steps, "decode_chunk"))

    @property
    def timings(self) -> bool | str:
        """False, True (a timestamp after every op) or "total": how the graphs of the steps that run
        from now on are timed (benchmarks read last_step.timings()); each pool records a step again
        the first time it runs under a new setting, and drops the shared pools' graphs."""
        return self.runner.recorder.timings

    @timings.setter
    def timings(self, mode: bool | str) -> None:
        if mode not in (False, True, "total"):
            raise _core.ArgumentError(f"timings: expected False, True or 'total', got {mode!r}")
        self.runner.recorder.timings = mode
        self.reset_graphs()

    # ---------------------------------------------------------------------------- weights
    @classmethod
    def from_weights(
        cls,
        weights: Mapping[str, Any] | str | os.PathLike[str],
        config: BitNetConfig | None = None,
        progress: bool | None = None,
        **kwargs: Any,
    ) -> BitNetModel:
        """weights: {name: array} or the path of a safetensors file or of a checkpoint directory
        (one file or shards with model.safetensors.index.json; config.json read from the
        directory, or beside a single file, unless `config` is given). Projections may be float
        matrices [out, in] (quantized on load: absmean, per tensor), transformers' packed uint8
        [out / 4, in] with a ``.weight_scale`` (W = values / weight_scale, as transformers'
        BitLinear), or int8 ternary values [out, in] with a ``.weight_scale`` in the same sense
        (AutoBitLinear checkpoints as transformers reads them: weights.projection).
        progress: a progress bar on stderr while the layers load (None: for checkpoints over
        256 MiB where stderr is a terminal). The model's `load_summary` says what was loaded;
        it is also logged (logger "bitnet_gpu", INFO)."""
        begin = time.perf_counter()
        checkpoint = read_checkpoint(weights, config)
        if kwargs.get("embedding_dtype") is None:
            kwargs["embedding_dtype"] = table_dtype(checkpoint.tensors)
        dtype = _table_dtype(kwargs["embedding_dtype"])
        device = kwargs["device"] = kwargs.get("device") or _default_device()
        if progress is None:
            progress = checkpoint.nbytes > 256 * 2**20 and sys.stderr.isatty()
        c = checkpoint.config
        loaded = DecoderWeights.load(checkpoint.tensors, c, dtype, device, bool(progress))
        model = cls(c, weights=loaded, **kwargs)
        if checkpoint.folder is not None:
            model.generation_config = checkpoint.generation_config
            model.tokenizer_from(checkpoint.folder)
        model.load_summary = (
            f"loaded {checkpoint.source}: {c.num_hidden_layers} layers, "
            f"{c.parameter_count() / 1e9:.2f} B parameters ({c.linear_class}, "
            f"{c.quantization_mode}), embedding and head {model.embedding_dtype}"
            f"{' (tied)' if c.tie_word_embeddings else ''}, {model.nbytes / 2**30:.2f} GiB on "
            f"{model.device.name} in {time.perf_counter() - begin:.1f} s"
        )
        _log.info(model.load_summary)
        return model

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **kwargs: Any) -> BitNetModel:
        """A checkpoint directory in the Hugging Face layout (config.json, model.safetensors or
        shards with their index, tokenizer.json, tokenizer_config.json, generation_config.json),
        as from_weights(path) reads it; keyword arguments as the constructor takes them."""
        return cls.from_weights(checkpoint_directory(path), **kwargs)

    @classmethod
    def random(cls, config: BitNetConfig, seed: int = 0, **kwargs: Any) -> BitNetModel:
        """Random ternary weights (uniform over {-1, 0, 1}, gamma = 1 / sqrt(in_features)),
        embedding N(0, 1), norm weights near one: for tests and benchmarks."""
        if not isinstance(config, BitNetConfig):
            raise TypeError(f"config: expected a BitNetConfig, got {type(config).__name__}")
        device = kwargs["device"] = kwargs.get("device") or _default_device()
        dtype = _table_dtype(kwargs.get("embedding_dtype"))
        weights = DecoderWeights.random(config, seed_value(seed), dtype, device)
        return cls(config, weights=weights, **kwargs)

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The checkpoint's tokenizer (tokenizer.json, tokenizer_config.json), read on first use,
        or None where the model came from elsewhere or the directory has none."""
        if self._tokenizer is None and self._tokenizer_folder is not None:
            self._tokenizer = Tokenizer.from_directory(self._tokenizer_folder)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Tokenizer | None) -> None:
        if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer: expected a Tokenizer, got {type(tokenizer).__name__}")
        self._tokenizer = tokenizer
        self._tokenizer_folder = None

    def tokenizer_from(self, folder: str) -> None:
        """The tokenizer becomes `folder`'s, read when first used (from_pretrained's)."""
        self._tokenizer, self._tokenizer_folder = None, folder

    @property
    def screening_nbytes(self) -> int:
        """Bytes of the head's int8 screening copy (0 until a decode step has built it)."""
        return self.screening.nbytes

    def prepare_screened_head(self) -> None:
        """Builds the head's int8 screening copy now (a decode step builds it when first needed:
        NumPy over the whole head, seconds for the 2B4T vocabulary); nothing if screened_head is
        off."""
        if self.screened_head:
            self.screening.tables(self.lm_head)

    # ---------------------------------------------------------------------------- running
    @property
    def last_step(self) -> RecordedStep | None:
        """The graph of the latest replay (its plan, and timings() where timings is on)."""
        return self.runner.last

    def recorded_plans(self) -> list[StepPlan]:
        """The plans of the graphs forward/generate/stream keep, over every batch size."""
        return [plan for pool in self.runner.shared.values() for plan in pool.graphs.plans()]

    @property
    def cache_nbytes(self) -> int:
        """Bytes of the KV caches forward/generate/stream hold (sessions hold their own)."""
        return sum(pool.nbytes for pool in self.runner.shared.values())

    def reset_graphs(self) -> None:
        """Drops the graphs forward/generate/stream recorded (recorded again when next run)."""
        for pool in self.runner.shared.values():
            pool.graphs.clear()

    def session(self, batch: int = 1) -> DecodeSession:
        """A KV cache of its own for `batch` sequences (batch x max_tokens x layers x 2 x kv heads
        x head dim in kv_cache_dtype, allocated at the first step), fed and read through
        DecodeSession.step, forward, stream and generate: the public decode-step API."""
        return DecodeSession(self, batch)

    def shared_session(self, batch: int) -> DecodeSession:
        """An empty session of `batch` sequences over the model's own KV cache for that batch size,
        which forward, generate and stream use (each call empties it again)."""
        return DecodeSession(self, batch, self.runner.shared_pool(count(batch, "batch")))

    def forward(self, token_ids: Any, attention_mask: Any = None) -> np.ndarray:
        """logits float32 [B, T, vocab] (or [T, vocab] for 1-D token_ids) of a prefill from an
        empty cache; the model's cache then holds these tokens. With an attention_mask
        (1: token, 0: padding before or after a sequence's tokens) each sequence is computed
        alone, from position 0, and padding's rows are zeros; a list of sequences of different
        lengths works the same way."""
        return self.shared_session(batch_of(token_ids)).forward(token_ids, attention_mask)

    @generation_method
    def stream(self, token_ids: Any, options: GenerationOptions) -> Iterator[np.ndarray]:
        """Yields the next token ids (int32 [B]) one step at a time: a prefill of the prompt, then
        one graph replay per decode_chunk tokens (yielded together as the replay ends).
        token_ids: [T], [B, T] (with an optional attention_mask) or a list of B sequences of any
        lengths; each sequence takes its own positions, as alone."""
        options = options.resolved(self.generation_config, text=False)
        session = session_for(self, token_ids, options)
        for step, (ids, _) in enumerate(stream_ids(session, token_ids, options)):
            if options.callback is not None:
                options.callback(step, ids)
            yield ids

    @generation_method
    def generate(self, token_ids: Any, options: GenerationOptions) -> Any:
        """The prompt followed by up to max_new_tokens generated ids ([T + n], [B, T + n] with
        the prompt's padding kept, or for a list of sequences a list of arrays); see stream.
        callback(step, ids [B]) is called as each token arrives (streaming).
        return_dict_in_generate: a GenerateOutput (sequences, and with output_logits each step's
        logits, with output_scores each step's logits as the draw saw them), as transformers."""
        options = options.resolved(self.generation_config, text=False)
        return generate_ids(session_for(self, token_ids, options), token_ids, options)

    @generation_method
    def stream_text(self, prompt: Any, options: GenerationOptions) -> Iterator[str]:
        """Yields the generated text in pieces as tokens arrive, never a broken UTF-8 character,
        until an end id or max_new_tokens. prompt: text, or a conversation of messages rendered by
        the chat template. callback(step, id) is called as each token arrives, the end id too.
        session: a DecodeSession of one sequence to go on with, as a chat does: where the
        prompt's ids begin with the ones the session holds, only the rest is fed; otherwise the
        session starts again from the whole prompt."""
        return stream_text(self, prompt, options)

    @generation_method
    def generate_text(self, prompt: Any, options: GenerationOptions) -> str | list[str]:
        """The text generated after `prompt` (see stream_text), without the end token. A list of
        prompts (texts or conversations) runs as one batch of different lengths and gives a list
        of texts, sequence b's draws keyed by its index b."""
        return generate_text(self, prompt, options)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"<bitnet_gpu.models.BitNetModel layers={c.num_hidden_layers} hidden={c.hidden_size} "
            f"vocab={c.vocab_size} max_tokens={self.max_tokens} nbytes={self.nbytes}>"
        )


def _table_dtype(embedding_dtype: Any) -> np.dtype:
    """The embedding and head's dtype: float16 (None) or float32; DTypeError otherwise."""
    chosen = np.float16 if embedding_dtype is None else embedding_dtype
    return float_dtype(chosen, "embedding_dtype")

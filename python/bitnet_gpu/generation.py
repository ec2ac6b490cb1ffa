"""Running a BitNetModel: KV caches, decode sessions and generation as transformers does it.

    session = model.session()                        # a KV cache of its own (batch=1)
    logits = session.step(prompt_ids)                # [vocab]: the distribution of the next token
    logits = session.step([next_id])                 # one decode step: the cache grows by one
    for ids in session.stream(more_ids, 32): ...     # generation continues from the cache

A batch's prompts may have different lengths: pass them as a list of sequences, or as one
padded array with an `attention_mask` (1 for a token, 0 for padding, on either side, as
transformers' tokenizers produce it). Each sequence keeps its own length in the cache and its
own positions (the first real token at position 0, as transformers' `generate` counts them), so
a sequence's tokens are the ones it would get alone, up to the int8 rounding ties NUMERICS.md
names.
"""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np

from . import _core, reference
from ._args import _integer
from .sampling import _sampling_params

__all__ = ["DecodeSession", "GenerateOutput"]

# The step modes that draw (BitNetModel._record): without top-p, with it, with it and top_k.
SAMPLED = ("sample", "nucleus", "nucleus_top_k")


@dataclasses.dataclass
class GenerateOutput:
    """What generate(..., return_dict_in_generate=True) returns, as transformers'
    GenerateDecoderOnlyOutput: `sequences` (the prompt and the new ids), and where asked for,
    `logits` (each step's raw logits, float32 [B, vocab]) and `scores` (each step's logits as the
    draw saw them: divided by the temperature, -inf outside the top-k and top-p kept values; the
    raw logits for greedy decoding)."""

    sequences: np.ndarray | list
    scores: tuple | None = None
    logits: tuple | None = None


def is_ragged(token_ids) -> bool:
    """Whether token_ids is a list of sequences (of any lengths) rather than one array."""
    return isinstance(token_ids, (list, tuple)) and any(
        np.ndim(s) == 1 or isinstance(s, (list, tuple)) for s in token_ids
    )


class _Context:
    """A KV cache of `batch` sequences (allocated at its first step) and the graphs recorded
    over it. It holds the model weakly: the model keeps its own contexts, and a cycle would
    leave a dropped model's device memory to the garbage collector."""

    def __init__(self, model, batch):
        self._model, self.batch = weakref.ref(model), batch
        self.caches = None
        self.graphs: dict[tuple, object] = {}

    @property
    def model(self):
        return self._model()

    @property
    def cache_nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.caches) if self.caches else 0

    def graph(self, tokens, logits, start, steps=1, logits_output=False):
        """The graph of a step of `tokens` new tokens a sequence after at most `start` cached
        ones, recorded at its first use (prefill graphs: only the latest few are kept)."""
        model = self.model
        if self.caches is None:
            self.caches = model._new_cache(self.batch)
        split = model._split_keys(tokens, start)
        screens = model._screens(self.batch, logits) and not logits_output
        key = (tokens, logits, split, screens, steps, logits_output)
        if key in self.graphs:
            self.graphs[key] = self.graphs.pop(key)  # most recently used last
        else:
            prefill = [k for k in self.graphs if k[0] > 1]
            if tokens > 1 and len(prefill) >= model.KEPT_PREFILL_GRAPHS:
                del self.graphs[prefill[0]]
            self.graphs[key] = model._record(
                self.caches, self.batch, tokens, logits, split, steps, logits_output
            )
        model._latest_graph = self.graphs[key]  # whose timings a benchmark reads
        return self.graphs[key]

    def run(self, ids, starts, lengths, mode, steps=1, sampling=None, logits_output=False):
        """One replay: ids int32 [B, T] (sequence b's lengths[b] tokens first), after starts[b]
        cached tokens; `steps` decode steps where T is 1. Returns the graph's outputs."""
        model = self.model
        batch, tokens = ids.shape
        cached = int(starts.max())
        if cached + tokens + steps - 1 > model.max_tokens:
            raise _core.ShapeError(
                f"{cached} cached + {tokens + steps - 1} new tokens exceed "
                f"max_tokens={model.max_tokens}"
            )
        graph = self.graph(tokens, mode, cached, steps, logits_output)
        inputs = {
            "start" if i == 0 else f"start{i}": (starts + i).astype(np.int32) for i in range(steps)
        }
        if tokens > 1 and mode != "all":
            inputs["last"] = (np.arange(batch) * tokens + lengths - 1).astype(np.int32)
            inputs["drawn_at"] = (starts + lengths).astype(np.int32)
        if sampling is not None:
            inputs["sampling"] = sampling
        return graph.run(ids=ids.reshape(-1).astype(np.int32), **inputs)


class DecodeSession:
    """A KV cache of `batch` sequences that grows as tokens are fed (model.session()). `step`
    feeds tokens and returns the next token's logits; `stream` and `generate` continue from what
    the cache holds. A generated sequence's last id is not in the cache yet: the next call feeds
    it first, so a conversation goes on turn after turn without computing its past again."""

    def __init__(self, model, batch=1, context=None):
        self.model = model
        self.batch = _integer(batch, "batch")
        if self.batch < 1:
            raise _core.ArgumentError(f"batch: expected at least 1, got {batch}")
        self._context = context if context is not None else _Context(model, self.batch)
        self.reset()

    def reset(self):
        """Forgets the cached tokens (the cache's memory and the recorded graphs stay)."""
        self._lengths = np.zeros(self.batch, np.int64)
        self._pending: np.ndarray | None = None
        self._tokens: list[list[int]] = [[] for _ in range(self.batch)]

    @property
    def lengths(self) -> np.ndarray:
        """int64 [batch]: the tokens each sequence holds (the cached ones and a generated id not
        fed yet)."""
        return self._lengths + (0 if self._pending is None else 1)

    @property
    def token_ids(self) -> list[np.ndarray]:
        """Each sequence's ids so far (prompts and generated tokens), int64."""
        return [np.array(t, np.int64) for t in self._tokens]

    @property
    def cache_nbytes(self) -> int:
        return self._context.cache_nbytes

    def __repr__(self):
        return (
            f"<bitnet_gpu.DecodeSession batch={self.batch} lengths={self.lengths.tolist()} "
            f"max_tokens={self.model.max_tokens}>"
        )

    # ------------------------------------------------------------------------------- inputs
    def _sequences(self, token_ids, attention_mask):
        """(sequences, columns, shape): each sequence's new ids (int32, the pending id first),
        the columns of the caller's array they came from, and that array's [B, T] (None for a
        list of sequences)."""
        vocab = self.model.config.vocab_size
        if is_ragged(token_ids):
            if attention_mask is not None:
                raise _core.ArgumentError("attention_mask: pass it with one padded [B, T] array")
            rows = [np.asarray(s) for s in token_ids]
            shape = None
        else:
            ids = np.asarray(token_ids)
            if ids.ndim == 1:  # one sequence's ids, or one id a sequence of a batch
                ids = ids[None, :] if self.batch == 1 else ids[:, None]
            if ids.ndim != 2:
                raise _core.ShapeError(
                    f"token_ids: expected [T] or [B, T], got shape {np.shape(token_ids)}"
                )
            shape = ids.shape
            mask = (
                np.ones(ids.shape, bool)
                if attention_mask is None
                else self._mask(attention_mask, ids.shape)
            )
            rows = [ids[b][mask[b]] for b in range(ids.shape[0])]
        if len(rows) != self.batch:
            raise _core.ShapeError(
                f"token_ids: {len(rows)} sequences for a session of batch {self.batch}"
            )
        if self._pending is None and all(r.size == 0 for r in rows) and self._lengths.min() > 0:
            # Nothing new: each sequence's last cached token is fed again (its keys and values
            # are written where they are), which gives the logits that follow it.
            self._lengths -= 1
            self._pending = np.array([t[-1] for t in self._tokens], np.int64)
        sequences, columns = [], []
        for b, row in enumerate(rows):
            if row.dtype.kind not in "iu" and not (row.size == 0 and row.dtype.kind == "f"):
                raise _core.DTypeError(f"token_ids: expected integers, got {row.dtype}")
            if row.ndim != 1:
                raise _core.ShapeError(f"token_ids: sequence {b} is not one-dimensional")
            if row.size and (row.min() < 0 or row.max() >= vocab):
                raise _core.ArgumentError(f"token_ids: ids must lie in [0, {vocab})")
            if self._pending is not None:
                row = np.concatenate([self._pending[b : b + 1], row.astype(np.int64)])
            if row.size == 0:
                raise _core.ShapeError(f"token_ids: sequence {b} has no tokens")
            sequences.append(row.astype(np.int32))
            if shape is not None:
                columns.append(np.flatnonzero(mask[b]))
        return sequences, columns, shape

    @staticmethod
    def _mask(attention_mask, shape):
        mask = np.asarray(attention_mask)
        if mask.ndim == 1:
            mask = mask[None, :]
        if mask.shape != tuple(shape):
            raise _core.ShapeError(
                f"attention_mask: expected shape {tuple(shape)}, got {np.shape(attention_mask)}"
            )
        if mask.dtype.kind not in "biu" or not np.isin(mask, (0, 1)).all():
            raise _core.ArgumentError("attention_mask: expected 0 (padding) and 1 (token) only")
        mask = mask.astype(bool)
        for b, row in enumerate(mask):
            on = np.flatnonzero(row)
            if on.size == 0 or on[-1] - on[0] + 1 != on.size:
                raise _core.ArgumentError(
                    f"attention_mask: row {b} must hold one run of ones (padding before or "
                    "after the tokens, not between them)"
                )
        return mask

    @staticmethod
    def _padded(sequences):
        """int32 [B, T] with sequence b's ids first (zeros after), and the lengths."""
        lengths = np.array([s.size for s in sequences], np.int64)
        ids = np.zeros((len(sequences), int(lengths.max())), np.int32)
        for b, s in enumerate(sequences):
            ids[b, : s.size] = s
        return ids, lengths

    def _feed(self, sequences, mode, sampling=None, logits_output=False):
        """Feeds each sequence's ids in one step; the pending id is then in the cache."""
        ids, lengths = self._padded(sequences)
        result = self._context.run(ids, self._lengths, lengths, mode, 1, sampling, logits_output)
        for b, s in enumerate(sequences):
            self._tokens[b].extend(int(i) for i in s[(self._pending is not None) :])
        self._lengths += lengths
        self._pending = None
        return result, lengths

    # ------------------------------------------------------------------------------ stepping
    def step(self, token_ids, attention_mask=None) -> np.ndarray:
        """Feeds token_ids (one sequence's ids [T], a batch's [B, T] with an optional
        attention_mask, or a list of B sequences) into the cache and returns the logits of the
        token after each sequence's last, float32 [B, vocab] ([vocab] for a session of one
        sequence given 1-D ids). No new ids ([] or [B, 0]) gives the logits after what the
        cache holds."""
        sequences, _, _ = self._sequences(token_ids, attention_mask)
        result, _ = self._feed(sequences, "last")
        logits = result["logits"].numpy()
        return logits[0] if self.batch == 1 and np.ndim(token_ids) == 1 else logits

    def forward(self, token_ids, attention_mask=None) -> np.ndarray:
        """As step, but the logits of every token fed: float32 [B, T, vocab] in token_ids'
        layout ([T, vocab] for 1-D ids; zeros where attention_mask is 0; for a list of
        sequences, T is the longest and the rows past a sequence's end are zeros)."""
        pending = self._pending is not None
        sequences, columns, shape = self._sequences(token_ids, attention_mask)
        result, lengths = self._feed(sequences, "all")
        vocab = self.model.config.vocab_size
        computed = result["logits"].numpy().reshape(self.batch, -1, vocab)
        width = shape[1] if shape is not None else int(lengths.max()) - pending
        out = np.zeros((self.batch, width, vocab), np.float32)
        for b in range(self.batch):
            rows = computed[b, int(pending) : int(lengths[b])]
            out[b, columns[b] if shape is not None else np.arange(len(rows))] = rows
        return out[0] if self.batch == 1 and np.ndim(token_ids) == 1 else out

    # ---------------------------------------------------------------------------- generating
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
        """Feeds token_ids (as step takes them) and yields the next ids (int32 [B]) as they are
        generated: see BitNetModel.stream. max_new_tokens 0 feeds nothing."""
        for ids, _ in self._generate(
            token_ids,
            max_new_tokens,
            temperature,
            top_k,
            seed,
            eos_token_id,
            top_p,
            attention_mask,
            pad_token_id,
            False,
        ):
            yield ids

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
        """token_ids followed by up to max_new_tokens generated ids: see BitNetModel.generate."""
        new, logits = [], []
        for step, (chosen, step_logits) in enumerate(
            self._generate(
                token_ids,
                max_new_tokens,
                temperature,
                top_k,
                seed,
                eos_token_id,
                top_p,
                attention_mask,
                pad_token_id,
                output_logits or output_scores,
            )
        ):
            new.append(chosen)
            logits.append(step_logits)
            if callback is not None:
                callback(step, chosen)
        sequences = _joined(token_ids, new)
        if not return_dict_in_generate:
            return sequences
        raw = tuple(logits) if output_logits else None
        scores = None
        if output_scores:
            temperature = float(temperature)
            scores = tuple(_scores(x, temperature, top_k, top_p) for x in logits)
        return GenerateOutput(sequences, scores, raw)

    def _generate(
        self,
        token_ids,
        max_new_tokens,
        temperature,
        top_k,
        seed,
        eos_token_id,
        top_p,
        attention_mask,
        pad_token_id,
        want_logits,
    ):
        model, batch = self.model, self.batch
        vocab = model.config.vocab_size
        if _integer(max_new_tokens, "max_new_tokens") < 0:
            raise _core.ArgumentError("max_new_tokens must be >= 0")
        if top_k is not None and not 0 < _integer(top_k, "top_k") <= vocab:
            raise _core.ArgumentError(f"top_k must lie in [1, {vocab}], got {top_k}")
        sampling = _sampling_params(temperature, top_k, seed, vocab, top_p)
        sequences, _, _ = self._sequences(token_ids, attention_mask)
        lengths = np.array([s.size for s in sequences])
        if int((self._lengths + lengths).max()) + max_new_tokens - 1 > model.max_tokens:
            raise _core.ShapeError(
                f"{int((self._lengths + lengths).max())} tokens and {max_new_tokens} new ones "
                f"exceed max_tokens={model.max_tokens}"
            )
        if max_new_tokens == 0:
            return
        mode = (
            "next"
            if temperature == 0
            else "sample"
            if not sampling[5]
            else "nucleus_top_k"
            if sampling[2]
            else "nucleus"
        )
        ends = model._end_ids(eos_token_id)
        pad = _pad_id(model, pad_token_id, ends)
        done = np.zeros(batch, bool)
        sampling_input = None if mode == "next" else sampling
        result, _ = self._feed(sequences, mode, sampling_input, want_logits)
        steps, made, base = 1, 0, None
        while True:
            for step in range(steps):
                chosen = result["next" if step == 0 else f"next{step}"].numpy()
                if ends:  # a finished sequence takes the padding id
                    chosen = np.where(done, pad, chosen).astype(np.int32)
                    done |= np.isin(chosen, ends)
                step_logits = (
                    result["logits" if step == 0 else f"logits{step}"].numpy()
                    if want_logits
                    else None
                )
                for b in range(batch):
                    self._tokens[b].append(int(chosen[b]))
                # A chunk's step `step` has fed the ids before `chosen`: the cache holds those,
                # and `chosen` waits (however far the caller reads).
                if base is not None:
                    self._lengths = base + step + 1
                self._pending = chosen.astype(np.int64)
                made += 1
                yield chosen, step_logits
                if made == max_new_tokens or (ends and done.all()):
                    return
            # Decode steps run decode_chunk at a time, each feeding the id the one before chose.
            base = self._lengths.copy()
            steps = model._chunk(int(base.max()), max_new_tokens - made)
            ids = self._pending.astype(np.int32).reshape(batch, 1)
            result = self._context.run(
                ids, base, np.ones(batch, np.int64), mode, steps, sampling_input, want_logits
            )


def _pad_id(model, pad_token_id, ends):
    """The id a finished sequence takes: pad_token_id, else generation_config.json's, else the
    first end id (transformers' rule)."""
    if pad_token_id is not None:
        return _integer(pad_token_id, "pad_token_id")
    configured = model.generation_config.get("pad_token_id")
    if isinstance(configured, (list, tuple)):
        configured = configured[0] if configured else None
    if configured is not None:
        return int(configured)
    return ends[0] if ends else 0


def _joined(token_ids, new):
    """The prompt followed by the new ids, in the prompt's form: [T + n], [B, T + n], or for a
    list of sequences a list of arrays."""
    if is_ragged(token_ids):
        return [
            np.concatenate([np.asarray(s, np.int64), np.array([n[b] for n in new], np.int64)])
            for b, s in enumerate(token_ids)
        ]
    ids = np.asarray(token_ids)
    squeeze = ids.ndim == 1
    ids = ids[None, :] if squeeze else ids
    out = np.concatenate([ids] + [n.reshape(-1, 1).astype(ids.dtype) for n in new], axis=1)
    return out[0] if squeeze else out


def _scores(logits, temperature, top_k, top_p):
    """A step's logits as the draw saw them (transformers' processed scores)."""
    if temperature == 0:
        return logits.copy()
    out = np.full_like(logits, -np.inf)
    t = np.float32(temperature)
    for b, row in enumerate(logits):
        kept = reference.sampling_kept(row, top_k, top_p, temperature)
        out[b, kept] = row[kept] / t
    return out

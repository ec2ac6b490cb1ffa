"""Speculative decoding that never changes the answer: each round drafts up to k ids a sequence
(prompt lookup, transformers' prompt_lookup_num_tokens, or a caller's proposer), verifies them in
one step that picks at every token, and keeps the longest prefix the model agrees with plus the
model's own next id. A verify step computes each token as its decode step would (recording.py):
its greedy ids, and its draws (keyed by the sequence, the seed and the position, as plain
sampling keys them), are plain decoding's, bit for bit. Rejected drafts leave nothing behind: the
session forgets them (their cache rows are rewritten before anything reads them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .. import _core
from .step import Pick

if TYPE_CHECKING:
    from .generation import GenerationOptions, StopRule
    from .step import StepOutputs
    from .session import DecodeSession

__all__ = ["prompt_lookup", "Drafter", "continue_speculative"]

# A sequence whose drafts keep failing decodes this many tokens plainly (doubling to the most)
# before it drafts again.
_FIRST_PAUSE, _MOST_PAUSE = 8, 64


def prompt_lookup(ids: np.ndarray, count: int, ngram_size: int = 2) -> np.ndarray:
    """Up to `count` drafted ids by transformers' PromptLookupCandidateGenerator's rule: for n from
    ngram_size down to 1, the last n ids are looked for in `ids`; the first occurrence with ids
    after it gives up to `count` of them. Empty where nothing matches."""
    ids = np.asarray(ids)
    length = ids.size
    if count <= 0 or length < 2:
        return ids[:0]
    for n in range(min(ngram_size, length - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(ids, n)
        matches = np.flatnonzero((windows == ids[length - n :]).all(axis=1))
        for start in matches:
            first = start + n
            if first < length:
                return ids[first : min(first + count, length)]
    return ids[:0]


class Drafter:
    """Each sequence's drafts and how many to ask for: most (k) to begin with, fewer after
    rejections (half of them, or the accepted count plus one), more after full acceptance
    (doubling to k); at none, a pause of plain decoding (growing while drafts keep failing) before
    it tries one again. proposer(ids so far, count) gives up to `count` ids."""

    def __init__(self, proposer: Callable[[np.ndarray, int], Sequence[int]], most: int, batch: int):
        self.proposer, self.most = proposer, most
        self.wanted = [most] * batch
        self.pause = [0] * batch
        self.pause_length = [_FIRST_PAUSE] * batch

    def propose(self, tokens: list[np.ndarray], room: list[int]) -> list[np.ndarray]:
        drafts = []
        for b, ids in enumerate(tokens):
            count = min(self.wanted[b], room[b])
            if self.pause[b] > 0 or count <= 0:
                drafts.append(np.zeros(0, np.int64))
                continue
            draft = np.asarray(self.proposer(ids, count), np.int64).reshape(-1)[:count]
            drafts.append(draft)
        return drafts

    def update(self, b: int, proposed: int, accepted: int) -> None:
        """After a verify step of `proposed` drafts for sequence b, `accepted` of them taken."""
        if proposed == 0:
            return
        if accepted == proposed:
            self.wanted[b] = min(self.most, max(2 * self.wanted[b], 1))
            self.pause_length[b] = _FIRST_PAUSE
        elif accepted == 0:
            self.wanted[b] //= 2
            if self.wanted[b] == 0:  # drafts keep failing: decode plainly for a while
                self.pause[b] = self.pause_length[b]
                self.pause_length[b] = min(2 * self.pause_length[b], _MOST_PAUSE)
                self.wanted[b] = 1
        else:
            self.wanted[b] = accepted + 1

    def plain(self, tokens: int) -> None:
        """`tokens` ids a sequence made by plain decode steps (each pause counts them down)."""
        self.pause = [max(0, p - tokens) for p in self.pause]

    @property
    def paused(self) -> bool:
        return all(p > 0 for p in self.pause)


def continue_speculative(
    session: DecodeSession,
    result: StepOutputs,
    new_tokens: int,
    pick: Pick,
    sampling: np.ndarray | None,
    stop: StopRule,
    options: GenerationOptions,
    want_logits: bool,
) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """stream_ids' loop after the prompt's step (its `result`), speculatively: yields (ids [B],
    logits or None) in lockstep, as plain decoding does. A sequence that ran ahead of the others
    (it made every id the stream still wants) is held: its rows in a verify step feed its last
    cached id again and change nothing. At the end the session holds what was yielded."""
    model, batch = session.model, session.batch
    drafter = Drafter(proposer_of(options), options.prompt_lookup_num_tokens or 8, batch)
    queues: list[deque] = [deque() for _ in range(batch)]  # ids made, not yet yielded
    first = result.ids()
    for b in range(batch):
        queues[b].append((int(first[b]), result.logits()[b] if want_logits else None))
    session.accept([first[b : b + 1] for b in range(batch)])
    start_lengths = session.lengths - 1  # each prompt, before its first new id
    yielded = 0
    while True:
        while all(queues):  # every sequence has its next id: one step of the stream
            pairs = [q.popleft() for q in queues]
            chosen = stop.apply(np.array([p[0] for p in pairs], np.int32))
            logits = np.stack([p[1] for p in pairs]) if want_logits else None
            yielded += 1
            yield chosen, logits
            if yielded == new_tokens or stop.finished:
                session.truncate(start_lengths + yielded)  # the session holds what was yielded
                return
        # What each sequence still has to make for the stream (at most new_tokens in all).
        need = [new_tokens - yielded - len(q) for q in queues]
        held = [n <= 0 for n in need]
        room = [max(0, n - 1) for n in need]  # drafts leave room for the model's own next id
        cached = session.cached
        if batch == 1:  # each verify row computed with its decode step's attention split
            room[0] = min(room[0], model.policy.verify_tokens(int(cached[0]), room[0] + 1) - 1)
        drafts = drafter.propose(session.token_ids, room)
        if not any(held) and not any(d.size for d in drafts):
            steps = model.policy.chain(int(cached.max()), min(need), batch)
            step = session.decode(steps, pick, sampling, keep_logits=want_logits)
            for s in range(steps):
                ids = step.ids(s)
                for b in range(batch):
                    queues[b].append((int(ids[b]), step.logits(s)[b] if want_logits else None))
                session.accept([ids[b : b + 1] for b in range(batch)], cached + s + 1)
            drafter.plain(steps)
            continue
        verified = session.verify(drafts, held, pick, sampling, keep_logits=want_logits)
        picks = verified.ids()
        logits = verified.logits() if want_logits else None
        kept, new_ids = session.lengths.copy(), []
        for b, draft in enumerate(drafts):
            if held[b]:
                new_ids.append(np.zeros(0, np.int64))
                continue
            agree = picks[b, : draft.size] == draft
            accepted = int(draft.size if agree.all() else np.argmin(agree))
            drafter.update(b, int(draft.size), accepted)
            taken = picks[b, : accepted + 1]  # the drafts the model agreed with, and its next id
            for t, token in enumerate(taken):
                queues[b].append((int(token), logits[b, t] if logits is not None else None))
            kept[b] = int(cached[b]) + 1 + accepted  # the pending id and the accepted drafts
            new_ids.append(taken[-1:])
        drafter.plain(1)
        # Forget the rejected drafts; the model's own next id waits, pending.
        session.truncate(kept)
        cached_now = np.where(held, cached, kept)
        session.accept(new_ids, cached_now)


def proposer_of(options: GenerationOptions) -> Callable[[np.ndarray, int], Sequence[int]]:
    """The caller's proposer, else prompt lookup with max_matching_ngram_size (2)."""
    if options.proposer is not None:
        return options.proposer
    ngram = options.max_matching_ngram_size or 2

    def lookup(ids: np.ndarray, count: int) -> Sequence[int]:
        return [int(i) for i in prompt_lookup(ids, count, ngram)]

    return lookup


def check_speculative(options: GenerationOptions) -> None:
    """ArgumentError for a bad prompt_lookup_num_tokens or max_matching_ngram_size."""
    for name in ("prompt_lookup_num_tokens", "max_matching_ngram_size"):
        value = getattr(options, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise _core.ArgumentError(f"{name}: expected a whole number, got {value!r}")
        least = 0 if name == "prompt_lookup_num_tokens" else 1
        if not least <= value <= 64:
            raise _core.ArgumentError(f"{name}: expected an integer in [{least}, 64], got {value}")
    if options.proposer is not None and not callable(options.proposer):
        raise _core.ArgumentError(f"proposer: expected a callable, got {options.proposer!r}")

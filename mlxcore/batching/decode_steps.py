"""Batched decode steps, pipelined: a step's pass is queued before the previous step's tokens are read.

Pipelined like mlx-lm's generation, for a batch: each step feeds every decoding sequence
its newest token, the one the previous step picked and nobody has read yet (a
lazy array: the caches need only the count), then queues the pass and only then
reads the previous picks. Building a step's graph (and the Python of the events)
overlaps computing the previous one.

A pick stays pending until the next step reads it, or until ``take_pending`` reads it
early (a sequence about to be preempted, to decode speculatively, or cancelled).
When a read token ends its reply, the pass that fed it has already run: the
cache holds the reply's last token (as ``Engine.generate``'s do), and the pick
that pass made is dropped.

A reply with a grammar (``constraints.py``) needs its previous pick to know its
next mask: its step queues the pass, reads the previous picks while the pass
runs, fills the masks on the CPU, then queues the pick on the masked logits
(one (B, V) ``where`` before the step's one sampler graph; unconstrained rows
keep every token). Log-probabilities are then the constrained distribution's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence as Listed
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import mlx.core as mx

from mlxcore.batching.batch_forward import BatchDecoder, feed_rows
from mlxcore.batching.constraints import Bitmask, GrammarError
from mlxcore.batching.hybrid_batch import HybridBatchDecoder
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.batching.sequence import Sequence
from mlxcore.compiled_forward import CompiledForward
from mlxcore.kv.hybrid import HybridCache
from mlxcore.kv.paged import PagedCache
from mlxcore.sampling_graphs import greedy_pick, sampled_pick

if TYPE_CHECKING:  # drafters.py builds on this module's runner
    from mlxcore.batching.drafters import Drafter

Read = tuple[Sequence, int, float, tuple[tuple[int, float], ...]]  # (reply, token, log-probability, top log-probs)


@dataclass
class _Picks:
    """One step's picks, in the order of ``seqs``; lazy until read."""

    seqs: list[Sequence]
    tokens: mx.array  # (B,) int
    logprobs: mx.array  # (B,)
    tops: list[tuple[mx.array, mx.array] | None]
    values: list[Read] | None = None

    def read(self) -> list[Read]:
        """Each row's (reply, token, log-probability, top log-probabilities), read once."""
        if self.values is None:
            tokens, logprobs = cast("list[int]", self.tokens.tolist()), cast("list[float]", self.logprobs.tolist())
            self.values = [(seq, token, logprob, () if top is None else _pairs(top))
                           for seq, token, logprob, top in zip(self.seqs, tokens, logprobs, self.tops)]
        return self.values


class DecodeSteps:
    """Queues batched decode steps and reads their picks one step late (see the module docstring)."""

    def __init__(self, forward: CompiledForward, decoder: BatchDecoder | HybridBatchDecoder) -> None:
        self.forward, self.decoder = forward, decoder
        self.drafter: Drafter | None = None  # the runner's, when it keeps hidden states (a block drafter)
        self.drafts: Callable[[Sequence], bool] = lambda seq: True  # whether a reply may draft (the runner's)
        self.last: _Picks | None = None  # the previous step's picks, read after the next step is queued
        self._next: _Picks | None = None  # the step just queued

    @property
    def pending(self) -> bool:
        return self.last is not None

    def queue(self, seqs: list[Sequence], feeds: Listed[PromptFeed] = ()) -> None:
        """Queue one step for ``seqs`` (each feeds its pending pick, or its last known id), with the prompt
        chunks ``feeds`` riding in the same pass (``BatchDecoder``)."""
        last = self.last
        rows = _rows_in(last, seqs)
        inputs = self._inputs(seqs, rows, last)
        logits = self._logits(seqs, inputs, feeds)  # (B, V)
        allowed = _allowed(seqs, rows, last, logits)
        if allowed is not None:
            logits = mx.where(allowed, logits, -mx.inf)
        tokens, logprobs = _pick(seqs, logits)
        tops: list[tuple[mx.array, mx.array] | None] = [None] * len(seqs)
        for row, seq in enumerate(seqs):  # (a reply that asked for them)
            if seq.request.top_logprobs:
                tops[row] = _top(logits[row], seq.request.top_logprobs)
        mx.async_eval(tokens, logprobs, [t for t in tops if t is not None])
        self._next = _Picks(seqs, tokens, logprobs, tops)

    @staticmethod
    def _inputs(seqs: list[Sequence], rows: list[int | None], last: _Picks | None) -> mx.array:
        """(B,) the token each sequence feeds: its pick of the last step (lazy), or its last known id."""
        if last is not None and last.seqs == seqs:  # the same batch as last step: its picks are the inputs
            return last.tokens
        sources = [last.tokens[row:row + 1] if row is not None and last is not None else mx.array([seq.ids[-1]])
                   for seq, row in zip(seqs, rows)]
        return sources[0] if len(sources) == 1 else mx.concatenate(sources)

    def _logits(self, seqs: list[Sequence], inputs: mx.array, feeds: Listed[PromptFeed]) -> mx.array:
        targets = [seq.caches.target for seq in seqs if seq.caches is not None]  # (every decoding one has caches)
        if len(seqs) == 1 and not feeds and not self.forward.split:  # a lone reply of a hybrid model: its layers
            targets[0].begin(1)
            logits: mx.array = self.forward(inputs[None], cache=targets[0].layers)[:, -1, :]
            return logits
        if isinstance(self.decoder, HybridBatchDecoder):
            return self.decoder(cast("list[HybridCache]", targets), inputs, feeds)
        # A block drafter reads the target's hidden states of every token its replies read: the decode rows too
        drafter = self.drafter
        taking = [self.drafts(seq) for seq in seqs] if drafter is not None else []
        keep = drafter.keeps if drafter is not None and any(taking) else ()
        starts = [target.offset for target in targets] if keep else []  # each row's position
        if len(seqs) == 1 and not feeds:  # one decode row, on any cache (a cache of one sequence rides alone)
            feed = feed_rows(self.forward, targets[0], inputs, self.decoder, keep)
            logits, kept = self.forward.logits(feed.h)[:, -1], feed.kept
        else:
            rows = self.decoder(cast("list[PagedCache]", targets), inputs, feeds, keep)
            assert rows is not None  # a decode row a sequence
            logits, kept = rows, self.decoder.kept
        if keep and drafter is not None:
            own = [row for row, takes in enumerate(taking) if takes]
            if len(own) < len(seqs):
                kept = {layer: h[mx.array(own)] for layer, h in kept.items()}
            drafter.took([(seqs[row], starts[row], 1) for row in own], kept)
        return logits

    def advance(self) -> list[Read]:
        """Read the previous step's picks (after ``queue``, or with nothing queued); make the queued step's
        picks the ones to read next. Picks of ended replies are dropped."""
        reads = self.last.read() if self.last else []
        self.last, self._next = self._next, None
        return reads

    def take_pending(self, seq: Sequence) -> Read | None:
        """Read ``seq``'s pending pick now, if it has one (it is then no longer pending)."""
        last = self.last
        if last is None or seq not in last.seqs:
            return None
        read = last.read()[last.seqs.index(seq)]
        self._forget(seq)
        return read

    def drop(self, seq: Sequence) -> None:
        """Forget ``seq``'s pending pick (its reply ended or was cancelled)."""
        self._forget(seq)

    def _forget(self, seq: Sequence) -> None:
        if self.last is not None and seq in self.last.seqs:
            row = self.last.seqs.index(seq)
            self.last = _without(self.last, row)


def _rows_in(last: _Picks | None, seqs: list[Sequence]) -> list[int | None]:
    """Each of ``seqs``' row among the picks ``last`` (None: it has no pending pick there)."""
    if last is None:
        return [None] * len(seqs)
    if last.seqs == seqs:  # the same batch as last step (most steps)
        return list(range(len(seqs)))
    where = {id(seq): row for row, seq in enumerate(last.seqs)}
    return [where.get(id(seq)) for seq in seqs]


def _without(picks: _Picks, row: int) -> _Picks | None:
    """``picks`` less one row (read or dropped); None when no row is left."""
    if len(picks.seqs) == 1:
        return None
    keep = [r for r in range(len(picks.seqs)) if r != row]
    values = [picks.values[r] for r in keep] if picks.values is not None else None
    index = mx.array(keep)
    return _Picks([picks.seqs[r] for r in keep], picks.tokens[index], picks.logprobs[index],
                  [picks.tops[r] for r in keep], values)


def _allowed(seqs: list[Sequence], rows: list[int | None], last: _Picks | None, logits: mx.array) -> mx.array | None:
    """(B, V) bool: each constrained reply's grammar mask after its pending pick (other rows all True), filled
    while the pass that makes ``logits`` runs; None when no reply is constrained. A matcher that fails is kept
    on its reply (``Constraint.failed``), whose row then keeps every token: the runner ends it with the error."""
    constrained = [seq for seq in seqs if seq.constraint is not None]
    if not constrained:
        return None
    mx.async_eval(logits)  # the pass runs while the masks are filled
    picks = last.read() if last is not None and any(row is not None for row in rows) else None
    mask = Bitmask(len(seqs), logits.shape[-1])
    for i, (seq, row) in enumerate(zip(seqs, rows)):
        constraint = seq.constraint
        if constraint is None or constraint.failed is not None:
            continue
        try:
            constraint.catch_up(seq.reply_ids + ([picks[row][1]] if row is not None and picks is not None else []))
            constraint.fill(mask.words[i])
        except GrammarError as error:
            constraint.failed = error
            mask.words[i] = -1
    return mx.array(mask.allowed())


def _pick(seqs: list[Sequence], logits: mx.array) -> tuple[mx.array, mx.array]:
    """(tokens (B,), log-probabilities (B,)): one pick for each group of rows that share a graph
    (``graph_of``): the plain greedy rows one argmax, the rows sampled with the same masks one compiled
    graph (each row with its own temperature, p and key), so a batch of one kind of request picks once
    and a mixed one once a kind. A reply with a repetition penalty keeps its own sampler (its own recent
    tokens). Each row draws what it draws alone."""
    groups: dict[object, list[int]] = {}
    for row, seq in enumerate(seqs):
        groups.setdefault(("own", row) if seq.graph is None else seq.graph, []).append(row)
    if len(groups) == 1:  # one kind of request: one pick for every row
        return _pick_rows(seqs, logits)
    picks = [_pick_rows([seqs[row] for row in rows], logits[mx.array(rows)]) for rows in groups.values()]
    order = [row for rows in groups.values() for row in rows]
    back = mx.array(sorted(range(len(order)), key=order.__getitem__))  # each row's place among the picks
    return (mx.concatenate([tokens.reshape(-1) for tokens, _ in picks])[back],
            mx.concatenate([logprobs.reshape(-1) for _, logprobs in picks])[back])


def _pick_rows(seqs: list[Sequence], logits: mx.array) -> tuple[mx.array, mx.array]:
    """The picks of rows of one group (``_pick``): ``logits`` (rows, V), theirs."""
    graph = seqs[0].graph
    if graph is None:  # one reply, its own sampler
        return seqs[0].picker(logits)
    picked: tuple[mx.array, mx.array]
    if graph == "greedy":
        picked = greedy_pick()(logits, logits)
        return picked
    fn, scalars = sampled_pick([seq.params for seq in seqs])
    keys = mx.stack([seq.picker.keys.next() for seq in seqs])
    picked = fn(logits.astype(mx.float32), logits, keys, *scalars)
    return picked


def _top(row: mx.array, count: int) -> tuple[mx.array, mx.array]:
    """The ``count`` likeliest tokens of a logits row and their log-probabilities (lazy)."""
    logprobs = row.astype(mx.float32) - mx.logsumexp(row.astype(mx.float32))
    ids = mx.argsort(-logprobs)[:count]
    return ids, logprobs[ids]


def _pairs(top: tuple[mx.array, mx.array]) -> tuple[tuple[int, float], ...]:
    return tuple(zip(cast("list[int]", top[0].tolist()), cast("list[float]", top[1].tolist())))

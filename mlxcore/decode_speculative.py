"""Draft-model speculative decoding: the draft proposes k tokens, the target checks them in one pass.

Each round: the draft feeds the tokens it has not seen and proposes d_1..d_k;
the target feeds [y, d_1..d_k] (y = the last emitted token) and scores k + 1
positions; rejection sampling keeps d_1..d_n and picks one more token t. The
target is rewound by k - n, the draft by k - 1 - n (when n = k the draft never
fed d_k: it is fed next round). k comes from ``DraftLengthController``; k = 0
decodes plainly (pipelined) until the controller asks for a round again.
Whenever the generator stops, ``settle`` makes both caches hold exactly the
prompt plus the emitted tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from mlxcore import decision_clock
from mlxcore.device_profile import current
from mlxcore.draft_length import DraftLengthController
from mlxcore.kv.errors import PoolExhaustedError
from mlxcore.kv.base import PENDING
from mlxcore.params import SamplingParams
from mlxcore.prefill import prefill, settle
from mlxcore.rejection import verify, verify_greedy
from mlxcore.sampling import KeyStream, distribution, draw, next_token


@dataclass
class SpecCounters:
    proposed: int = 0
    accepted: int = 0
    target_passes: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    draft_lengths: list[int] = field(default_factory=list)  # k chosen for each round of this reply (0: plain)


class SpeculativeDecoder:
    """Yields (token, logprob, from_draft) for one reply; see the module docstring."""

    def __init__(self, target: nn.Module, draft: nn.Module, target_cache, draft_cache,
                 params: SamplingParams, controller: DraftLengthController) -> None:
        self.target, self.draft = target, draft
        self.tcache, self.dcache = target_cache, draft_cache
        self.params, self.controller = params, controller
        self.keys = KeyStream(params.seed)
        self.vocab = min(target.args.vocab_size, draft.args.vocab_size)  # padding rows may differ
        self.counters = SpecCounters(accepted_by_position=[0] * controller.max_k)
        self.emitted: list[int] = []  # every token the caches must end up holding (prompt + reply)
        self.reply_tokens = 0  # tokens emitted

    def run(self, prompt: list[int]) -> Iterator[tuple[int, float, bool]]:
        """Both caches hold ``prompt[:-1]`` (or a prefix of it the draft lags on) when this starts."""
        self.emitted = list(prompt)
        try:
            k = self._choose()
            while True:
                if k:
                    yield from self._round(k)
                    k = self._choose()
                else:
                    k = yield from self._plain_run()
        finally:
            self.settle()

    def _choose(self) -> int:
        k = self.controller.choose()
        self.counters.draft_lengths.append(k)
        return k

    # one round -----------------------------------------------------------------

    def _plain_run(self) -> Iterator[tuple[int, float, bool]]:
        """Plain target steps, pipelined (``decode_steps.py``), until the controller asks for a round.

        Returns the draft length it asked for. The pass of each token is queued
        before its value is read; the last token of the run is emitted unfed, so
        the round that follows starts from the usual state (target holds all but it).
        """
        fed = self._unfed(self.tcache)
        token, logprob = self._pick(self._target_logits(fed)[-1:])
        mx.async_eval(token, logprob)
        last = decision_clock.now()
        while True:
            k = self._choose()
            if not k:  # go on: queue the next pass before reading this token
                self.tcache.begin([PENDING])
                logits = self.target(token.reshape(1, 1), cache=self.tcache.layers)[0, -1:, : self.vocab]
                next_token, next_logprob = self._pick(logits)
                mx.async_eval(next_token, next_logprob)
            value = token.item()
            if not k:
                self.tcache.correct_tail([value])
            now = decision_clock.now()
            self.controller.observe_plain(now - last)  # steady-state seconds per token
            last = now
            self.counters.target_passes += 1
            yield from self._emit([value], [logprob.item()], 0)
            if k:
                return k
            token, logprob = next_token, next_logprob

    def _round(self, k: int) -> Iterator[tuple[int, float, bool]]:
        """Draft, verify and accept with one synchronisation: every pass is queued lazily."""
        self._catch_up_draft()
        start = decision_clock.now()
        drafted, q = self._propose(k)  # (k,) lazy ids, (k, V) or None
        draft_seconds = None
        if self.controller.draft_timing_due():  # now and then: one more sync, to learn what a draft pass costs
            mx.eval(drafted)
            draft_seconds = decision_clock.now() - start
        fed = self._unfed(self.tcache)
        self.tcache.begin(fed + [PENDING] * k)  # the drafted ids are known after the sync below
        inputs = mx.concatenate([mx.array(fed), drafted])[None]
        logits = self.target(inputs, cache=self.tcache.layers)[0, -(k + 1):, : self.vocab]  # (k + 1, V)
        n, t, logprobs = self._accept(logits, drafted, q)
        ids = drafted.tolist()
        self.tcache.correct_tail(ids)
        if k > 1:
            self.dcache.correct_tail(ids[: k - 1])
        self.controller.observe_round(k, n, decision_clock.now() - start, draft_seconds)
        self._count(k, n)
        self._rewind(self.tcache, k - n)
        self._rewind(self.dcache, max(k - 1 - n, 0))
        yield from self._emit(ids[:n] + [t], logprobs, n)

    def _catch_up_draft(self) -> None:
        """Feed the draft what it missed during plain steps, before (and not timed as part of) a round.

        The controller times rounds to learn what each drafted token costs; a
        catch-up folded into that would make drafting look expensive for good.
        """
        missed = self._unfed(self.dcache)[:-1]
        if len(missed) > 1:  # a whole prompt when it starts: in the device's prefill chunks
            prefill(self.draft.wrapped, self.dcache, missed, current().prefill_chunk)

    def _propose(self, k: int) -> tuple[mx.array, mx.array | None]:
        """Queue k draft passes (the first also feeds what the draft has not seen), computed asynchronously."""
        fed = self._unfed(self.dcache)
        self.dcache.begin(fed)
        inputs, tokens, rows = mx.array(fed)[None], [], []
        for i in range(k):
            if i:
                self.dcache.begin([PENDING])
            logits = self.draft(inputs, cache=self.dcache.layers)[0, -1, : self.vocab]
            if self.params.greedy:
                token = mx.argmax(logits)
            else:
                rows.append(distribution(logits, self.params))
                token = draw(rows[-1], self.keys.next())
            mx.async_eval(token)  # start computing while the next pass is being built
            tokens.append(token)
            inputs = token.reshape(1, 1)
        return mx.stack(tokens), (mx.stack(rows) if rows else None)

    def _accept(self, logits: mx.array, drafted: mx.array, q: mx.array | None) -> tuple[int, int, list[float]]:
        """(n accepted, next token, log-probabilities of the n + 1 emitted tokens), after one evaluation."""
        if q is None:
            n, t = verify_greedy(mx.argmax(logits, axis=-1), drafted)
        else:
            n, t = verify(distribution(logits, self.params), q, drafted, self.keys.next())
        chosen = mx.concatenate([drafted, t[None]])  # (k + 1,): d_1..d_k, then t
        chosen = mx.where(mx.arange(chosen.size) == n, t, chosen)  # t sits right after the accepted run
        logprobs = mx.take_along_axis(logits, chosen[:, None], axis=-1)[:, 0] - mx.logsumexp(logits, axis=-1)
        mx.eval(n, t, logprobs, drafted)
        n_value = n.item()
        return n_value, t.item(), logprobs[: n_value + 1].tolist()

    def _pick(self, logits: mx.array) -> tuple[mx.array, mx.array]:
        token, logprob = next_token(logits, self.params, None if self.params.greedy else self.keys.next())
        return token[0], logprob[0]

    # cache bookkeeping -----------------------------------------------------------

    def _target_logits(self, inputs: list[int]) -> mx.array:
        """Feed ``inputs`` to the target; logits (len(inputs), vocab)."""
        self.tcache.begin(inputs)
        return self.target(mx.array(inputs)[None], cache=self.tcache.layers)[0, :, : self.vocab]

    def _unfed(self, cache) -> list[int]:
        """Emitted tokens the cache does not hold yet (at least the last one while decoding)."""
        return self.emitted[cache.offset:]

    def _rewind(self, cache, n: int) -> None:
        if n and cache.trim(n) != n:
            raise RuntimeError(f"KV cache rewind by {n} failed")  # trim raises first; belt and braces

    def _emit(self, tokens: list[int], logprobs: list[float], from_draft: int) -> Iterator[tuple[int, float, bool]]:
        for i, (token, logprob) in enumerate(zip(tokens, logprobs)):
            self.emitted.append(token)
            self.reply_tokens += 1
            yield token, logprob, i < from_draft

    def _count(self, k: int, n: int) -> None:
        c = self.counters
        c.proposed, c.accepted, c.target_passes = c.proposed + k, c.accepted + n, c.target_passes + 1
        for j in range(n):
            c.accepted_by_position[j] += 1

    def settle(self) -> None:
        """Make both caches hold exactly ``emitted``: trim what is ahead, feed what is behind."""
        settle(self.tcache, self.emitted, self.target)
        try:
            settle(self.dcache, self.emitted, self.draft)
        except PoolExhaustedError:  # no room to feed the draft all it lacks: it stays a prefix (caught up later)
            settle(self.dcache, self.emitted)

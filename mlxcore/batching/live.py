"""The engine thread's side of one running reply: its caches, ids, sampler, text and clock.

A ``Live`` outlives preemption: the caches go back to the pool, but the ids,
the sampler's random stream and the text so far stay, so a resumed reply goes
on exactly where it stopped (its prompt is the prompt plus what it generated).
"""

from __future__ import annotations

import time
from dataclasses import replace

import mlx.core as mx

from mlxcore.batching.constraints import Mask
from mlxcore.batching.handle import RequestHandle, RequestMetrics
from mlxcore.caches import Caches
from mlxcore.sampling import TokenPicker
from mlxcore.events import FinalEvent, GenerationStats, TokenEvent
from mlxcore.kv.errors import PoolExhaustedError
from mlxcore.decode_speculative import SpeculativeDecoder
from mlxcore.params import GenerationParams
from mlxcore.prefill import settle
from mlxcore.reply_text import ReplyText


class Live:
    """One reply being generated (one choice of a request)."""

    def __init__(self, handle: RequestHandle, params: GenerationParams, tokenizer, eos_ids: set[int],
                 cap: int | None, submitted: float, constraint: Mask | None = None) -> None:
        self.handle = handle
        self.constraint = constraint  # what its next token may be (a grammar's matcher), applied before sampling
        self.params = params
        self.ids = list(handle.request.prompt_ids)  # prompt, then every token generated
        self.prompt_tokens = len(self.ids)
        self.picker = TokenPicker(params, self.ids)
        self.reply = ReplyText(tokenizer, eos_ids, params.stop, cap)
        self.caches: Caches | None = None
        self.speculative: SpeculativeDecoder | None = None  # its rounds, counters and draws, once it drafts
        self.plain_clock: float | None = None  # when its last plain step alone read a token (drafting pays?)
        self.submitted = submitted
        self.first_token = self.last_token = None
        self.worst_gap = 0.0
        self.prefix_hits = 0
        self.computed_prompt = 0  # prompt tokens prefilled (not found cached; the last is fed by decoding)
        self.preemptions = 0
        self.admitted_once = False  # its caches were attached once (its prompt counted, its own caches used)
        self.late = False
        self.started_at: float | None = None  # when a step first worked on it

    @property
    def request_id(self) -> str:
        return self.handle.request_id

    @property
    def generated(self) -> list[int]:
        """The reply's tokens so far (what its constraint is fed)."""
        return self.ids[self.prompt_tokens:]

    def fork(self, handle: RequestHandle, params: GenerationParams, tokenizer, eos_ids: set[int],
             cap: int | None) -> Live:
        """Another choice of the same prompt, on caches sharing this one's blocks."""
        constraint = self.constraint.fresh() if self.constraint is not None else None
        child = Live(handle, params, tokenizer, eos_ids, cap, self.submitted, constraint)
        child.caches = self.caches.fork()
        child.prefix_hits, child.computed_prompt = self.prefix_hits, self.computed_prompt
        child.admitted_once = True
        return child

    def release(self) -> None:
        """Give the caches back (their full blocks stay cached for a prefix hit)."""
        self.settle_caches()
        if self.caches is not None:
            self.caches.release()
            self.caches = None

    def settle_caches(self, feed: bool = False) -> None:
        """The caches hold a prefix of ``ids``: what a round drafted or a step fed past the reply's end (or
        a pass stopped part way) is trimmed. ``feed``: a reply that drafted also feeds both caches what they
        lack, so that they hold exactly ``ids`` (the caller's chat goes on from them)."""
        if self.caches is None:
            return
        decoder = self.speculative if feed else None
        settle(self.caches.target, self.ids, decoder and decoder.target)
        draft = self.caches.draft
        if draft is None:
            return
        lag = len(self.ids) - draft.offset  # far behind (it decoded plainly): caught up at its next round
        try:
            settle(draft, self.ids, decoder.draft if decoder and lag <= decoder.controller.max_k + 1 else None)
        except PoolExhaustedError:  # no room to feed it: it stays a prefix
            settle(draft, self.ids)

    def leave_draft(self) -> None:
        """Decode on without the draft (a round did not fit in the pool, or the target wants its memory):
        the draft's cache goes back."""
        if self.caches is not None and self.caches.draft is not None:
            self.caches.draft.release()
            self.caches.draft = None

    def emit(self, token: int, logprob: float, from_draft: bool = False,
             top: tuple[tuple[int, float], ...] = ()) -> str | None:
        """Record a generated token and put its event; the finish reason if the reply ends with it."""
        now = time.monotonic()
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.worst_gap = max(self.worst_gap, now - self.last_token)
        self.last_token = now
        self.ids.append(token)
        delta, finish = self.reply.add(token)
        self.handle.put(TokenEvent(token=token, text=delta, logprob=logprob, from_draft=from_draft,
                                   finish_reason=finish, top_logprobs=top))
        return finish

    def finish(self, reason: str, stats_extra: dict | None = None) -> None:
        """Put the final event (``reason``: eos, length, stop or cancelled) with the request's figures;
        the caches go back to the pool, or to the caller with ``Request.keep_caches``."""
        self.settle_caches(feed=self.handle.request.keep_caches)
        if self.handle.request.keep_caches and self.caches is not None:
            self.handle.caches, self.caches = self.caches, None
        self.release()
        now = time.monotonic()
        count = self.reply.count
        first = self.first_token or now
        self.handle.metrics = RequestMetrics(
            queue_seconds=max((self.started_at or now) - self.submitted, 0.0),
            ttft_seconds=first - self.submitted,
            tpot_seconds=((self.last_token or first) - first) / (count - 1) if count > 1 else 0.0,
            worst_gap_seconds=self.worst_gap, preemptions=self.preemptions,
            prefix_hit_tokens=self.prefix_hits, late=self.late)
        stats = GenerationStats(prompt_tokens=self.prompt_tokens, reused_tokens=self.prefix_hits,
                                prefill_tokens=self.computed_prompt + (self.first_token is not None), prefill_seconds=first - self.submitted,
                                generated_tokens=count, decode_seconds=(self.last_token or first) - first,
                                ttft_seconds=first - self.submitted, finish_reason=reason,
                                peak_memory_bytes=mx.get_peak_memory(), **self._draft_figures(count))
        if stats_extra:
            stats = replace(stats, **stats_extra)
        self.handle.put(FinalEvent(finish_reason=reason, text=self.reply.text, stats=stats))

    def _draft_figures(self, count: int) -> dict:
        if self.speculative is None:
            return {"target_passes": count}
        c = self.speculative.counters
        return {"draft_proposed": c.proposed, "draft_accepted": c.accepted,
                "target_passes": c.rounds + count - c.round_tokens,
                "accepted_by_position": tuple(c.accepted_by_position), "draft_lengths": tuple(c.draft_lengths)}

    def started(self, now: float) -> None:
        """A step works on it (the first call sets ``started_at``)."""
        if self.started_at is None:
            self.started_at = now

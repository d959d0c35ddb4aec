"""The engine thread's side of one running reply: its caches, ids, sampler, text and clock.

A ``Live`` outlives preemption: the caches go back to the pool, but the ids,
the sampler's random stream and the text so far stay, so a resumed reply goes
on exactly where it stopped (its prompt is the prompt plus what it generated).
"""

from __future__ import annotations

import time
from dataclasses import replace

import mlx.core as mx

from mlxcore.batching.handle import RequestHandle, RequestMetrics
from mlxcore.caches import Caches
from mlxcore.sampling import TokenPicker
from mlxcore.events import FinalEvent, GenerationStats, TokenEvent
from mlxcore.kv.errors import CacheStateError, PoolExhaustedError
from mlxcore.params import GenerationParams
from mlxcore.prefill import settle
from mlxcore.reply_text import ReplyText


class Live:
    """One reply being generated (one choice of a request)."""

    def __init__(self, handle: RequestHandle, params: GenerationParams, tokenizer, eos_ids: set[int],
                 cap: int | None, submitted: float) -> None:
        self.handle = handle
        self.params = params
        self.ids = list(handle.request.prompt_ids)  # prompt, then every token generated
        self.prompt_tokens = len(self.ids)
        self.picker = TokenPicker(params, self.ids)
        self.reply = ReplyText(tokenizer, eos_ids, params.stop, cap)
        self.caches: Caches | None = None
        self.speculative = None  # (decoder, token iterator) while it decodes alone with the draft
        self.submitted = submitted
        self.first_token = self.last_token = None
        self.worst_gap = 0.0
        self.prefix_hits = 0
        self.computed_prompt = 0  # prompt tokens prefilled (not found cached; the last is fed by decoding)
        self.preemptions = 0
        self.admitted_once = False  # its caches were attached once (its prompt counted, its own caches used)
        self.late = False
        self.started_at: float | None = None  # when a step first worked on it
        self.draft_proposed = self.draft_accepted = 0  # over its speculative spells
        self.spec_passes = self.spec_tokens = 0  # target passes and tokens of its speculative spells
        self.accepted_by_position: list[int] = []
        self.draft_lengths: list[int] = []  # k of each speculative round (0: a plain step within a spell)

    @property
    def request_id(self) -> str:
        return self.handle.request_id

    def fork(self, handle: RequestHandle, params: GenerationParams, tokenizer, eos_ids: set[int],
             cap: int | None) -> Live:
        """Another choice of the same prompt, on caches sharing this one's blocks."""
        child = Live(handle, params, tokenizer, eos_ids, cap, self.submitted)
        child.caches = self.caches.fork()
        child.prefix_hits, child.computed_prompt = self.prefix_hits, self.computed_prompt
        child.admitted_once = True
        return child

    def release(self) -> None:
        """Give the caches back (their full blocks stay cached for a prefix hit)."""
        self.close_speculative(decoding_on=False)
        if self.caches is not None:
            self.caches.release()
            self.caches = None

    def close_speculative(self, decoding_on: bool = True) -> None:
        """Leave speculative decoding. ``decoding_on``: batched decoding goes on, so the target cache goes
        back to holding all ids but the last (fed by the next step); else it holds them all."""
        if self.speculative is None:
            return
        decoder, tokens = self.speculative
        self.speculative = None
        c = decoder.counters
        self.draft_proposed += c.proposed
        self.draft_accepted += c.accepted
        self.spec_passes += c.target_passes
        self.spec_tokens += decoder.reply_tokens
        self.accepted_by_position = [a + b for a, b in zip(self.accepted_by_position or [0] * len(
            c.accepted_by_position), c.accepted_by_position)]
        self.draft_lengths += c.draft_lengths
        tokens.close()  # settles both caches to hold exactly ``ids``
        if decoding_on:
            self.caches.target.trim(1)

    def settle_caches(self) -> None:
        """After a step stopped part way: the caches hold ``ids``, or a prefix of them when the prompt was
        being read (speculative decoding feeds both what they lack of the reply)."""
        self.close_speculative(decoding_on=False)
        if self.caches is not None:
            for cache in (self.caches.target, self.caches.draft):
                if cache is not None:
                    settle(cache, self.ids)

    def drop_draft(self) -> None:
        """Give the draft's cache back (its bytes are wanted for the target's): a speculative spell ends as
        ``leave_draft``; between batched steps only the draft's cache goes."""
        if self.speculative is not None:
            self.leave_draft()
        elif self.caches is not None and self.caches.draft is not None:
            self.caches.draft.release()
            self.caches.draft = None

    def leave_draft(self) -> None:
        """Decode on without the draft: its round did not fit in the pool. Both caches are settled as far as
        the pool allows; the draft's goes back; the target's keeps a prefix of ``ids`` with the last token
        unfed, as batched decoding wants it (what it lacks is fed again as prompt)."""
        try:
            self.close_speculative(decoding_on=False)
        except PoolExhaustedError:  # a failed append changes nothing: the caches hold a prefix of ids
            pass
        if self.caches.draft is not None:
            self.caches.draft.release()
            self.caches.draft = None
        target = self.caches.target
        target.settle()
        extra = target.offset - (len(self.ids) - 1)
        if extra > 0 and target.trim(extra) != extra:
            raise CacheStateError(f"The KV cache could not be rewound by {extra} tokens.")

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
        self.close_speculative(decoding_on=False)
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
                                peak_memory_bytes=mx.get_peak_memory(), draft_proposed=self.draft_proposed,
                                draft_accepted=self.draft_accepted,
                                target_passes=self.spec_passes + count - self.spec_tokens,
                                accepted_by_position=tuple(self.accepted_by_position),
                                draft_lengths=tuple(self.draft_lengths))
        if stats_extra:
            stats = replace(stats, **stats_extra)
        self.handle.put(FinalEvent(finish_reason=reason, text=self.reply.text, stats=stats))

    def started(self, now: float) -> None:
        """A step works on it (the first call sets ``started_at``)."""
        if self.started_at is None:
            self.started_at = now

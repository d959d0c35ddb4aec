"""``Sequence``: one reply being generated, the one object the scheduler plans with and the runner works on.

The scheduler reads its counts (``length``, ``cached``: what its caches hold, ``generated``), priority
and deadline, and never a tensor. The runner keeps on it what generating needs:
the ids (prompt, then every token generated), the sampler's random stream, the
caches, the grammar's matcher, the text and the clock. A sequence outlives
preemption: its caches go back to the pool, but the ids, the sampler and the
text stay, so a resumed reply goes on exactly where it stopped.

A request for several choices (``n``) is one sequence per choice. The first
reads the prompt; the others follow it (``followers``) until it is read, then
fork its caches (sharing its blocks) and run as sequences of their own.
"""

from __future__ import annotations

import time
from dataclasses import replace

import mlx.core as mx

from mlxcore.batching.constraints import Mask
from mlxcore.batching.handle import RequestHandle
from mlxcore.batching.policies import NO_LIMIT_TOKENS
from mlxcore.batching.request import Priority, Request
from mlxcore.caches import Caches
from mlxcore.decode_speculative import SpeculativeDecoder
from mlxcore.events import FinalEvent, GenerationStats, TokenEvent
from mlxcore.kv.errors import PoolExhaustedError
from mlxcore.kv.paged import PagedCache
from mlxcore.params import GenerationParams
from mlxcore.prefill import hold
from mlxcore.reply_text import ReplyText
from mlxcore.sampling import TokenPicker
from mlxcore.sampling_graphs import graph_of

Generated = tuple[int, float, bool, tuple[tuple[int, float], ...]]  # a token, its logprob, drafted?, top logprobs


class Sequence:
    """One choice of a request, from its arrival to its final event."""

    def __init__(self, request: Request, arrival: float, max_new: int | None, handle: RequestHandle,
                 params: GenerationParams | None = None, reply: ReplyText | None = None,
                 constraint: Mask | None = None) -> None:
        self.request = request
        self.arrival = arrival  # decision_clock.now() of submission
        self.max_new = max_new  # the most tokens it may generate; None = until the context is full
        self.handle = handle  # where its events go
        self.request_id = handle.request_id  # this choice's own id (its handle's)
        self.deadline = request.deadline  # the request's (read of every sequence at every step)
        self.params = params or request.params
        # the rows its pick is made with: those of the same ``graph_of`` (None: a repetition penalty, its own)
        self.graph = graph_of(self.params) if self.params.repetition_penalty == 1.0 else None
        self.reply = reply  # its text, stop strings and token cap
        self.constraint = constraint  # what its next token may be (a grammar's matcher), applied before sampling
        self.ids = list(request.prompt_ids)  # prompt, then every token generated (its caches' ``ids`` too)
        self.prompt_tokens = len(self.ids)
        self.followers: list[Sequence] = []  # the request's other choices, until this one's prompt is read
        # the scheduler's state
        self.admitted = False
        self.preemptions = 0
        self.late = False
        self.first_scheduled: float | None = None
        self.paused_since: float | None = None  # its client stopped reading its events then: it is not decoded
        # the runner's state
        self.caches: Caches | None = None
        self.speculative: SpeculativeDecoder | None = None  # its rounds, counters and draws, once it drafts
        self._picker: TokenPicker | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.prefix_hits = 0
        self.computed_prompt = 0  # prompt tokens prefilled (not found cached; the last is fed by decoding)
        self.admitted_once = False  # its caches were attached once (its prompt counted, its own caches used)
        self.started_at: float | None = None  # when a step first worked on it

    # what the scheduler reads -------------------------------------------------

    @property
    def length(self) -> int:
        """Tokens it consists of: prompt, then every token generated so far."""
        return len(self.ids)

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_tokens

    @property
    def reply_ids(self) -> list[int]:
        """The tokens generated so far (what its constraint is fed)."""
        return self.ids[self.prompt_tokens:]

    @property
    def choices(self) -> int:
        """Replies that run from this prompt once it is read: this one and its followers."""
        return 1 + len(self.followers)

    @property
    def group(self) -> str:
        """The request it answers: the choices of one request share it."""
        return self.request.request_id

    @property
    def priority(self) -> Priority:
        return self.request.priority

    @property
    def cached(self) -> int:
        """Tokens its caches hold: its target cache's length, which each pass commits (0 without caches)."""
        return self.caches.target.offset if self.caches is not None else 0

    @property
    def prefill_left(self) -> int:
        """Tokens to feed before it decodes (the last token is fed by its first decode step)."""
        return max(len(self.ids) - 1 - self.cached, 0)

    @property
    def ready(self) -> bool:
        return self.admitted and len(self.ids) - 1 <= self.cached and not self.followers and self.paused_since is None

    @property
    def tokens_left(self) -> int:
        output = NO_LIMIT_TOKENS if self.max_new is None else self.max_new - self.generated
        return self.prefill_left + max(output, 0)

    @property
    def with_followers(self) -> list[Sequence]:
        return [self, *self.followers]

    # what the runner does with it ----------------------------------------------

    @property
    def picker(self) -> TokenPicker:
        """Its sampler (made at its first pick: its repetition history is then the prompt)."""
        if self._picker is None:
            self._picker = TokenPicker(self.params, self.ids)
        return self._picker

    def fork_from(self, leader: Sequence) -> None:
        """A follower takes caches sharing ``leader``'s blocks, now that the prompt is read."""
        assert leader.caches is not None  # its prompt is read
        self.caches = leader.caches.fork()
        self.caches.ids = self.ids
        self.prefix_hits, self.computed_prompt = leader.prefix_hits, leader.computed_prompt
        self.admitted_once = True

    def release(self) -> None:
        """Give the caches back (their full blocks stay cached for a prefix hit)."""
        self.hold_ids()
        if self.caches is not None:
            self.caches.release()
            self.caches = None

    def hold_ids(self, feed: bool = False) -> None:
        """The caches hold a prefix of ``ids``: what a round drafted or a step fed past the reply's end (or
        a pass stopped part way) is trimmed. ``feed``: a reply that drafted also feeds both caches what they
        lack, so that they hold exactly ``ids`` (the caller's chat goes on from them)."""
        if self.caches is None:
            return
        decoder = self.speculative if feed else None
        hold(self.caches.target, self.ids, decoder.target if decoder is not None else None)
        draft = self.caches.draft
        if draft is None:
            return
        lag = len(self.ids) - draft.offset  # far behind (it decoded plainly): caught up at its next round
        try:
            hold(draft, self.ids, decoder.draft if decoder and lag <= decoder.controller.max_k + 1 else None)
        except PoolExhaustedError:  # no room to feed it: it stays a prefix
            hold(draft, self.ids)

    def leave_draft(self) -> None:
        """Decode on without the draft (a round did not fit in the pool, or the target wants its memory):
        the draft's cache goes back."""
        if self.caches is not None and self.caches.draft is not None:
            self.caches.draft.release()
            self.caches.draft = None

    def emit(self, tokens: list[Generated]) -> tuple[int, str | None]:
        """Record generated tokens, up to one that ends the reply, and put their events as one arrival (a
        speculative round's go to a client together); how many, and the finish reason if the reply ended."""
        now = time.monotonic()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        reply, events, finish = self.reply, [], None
        assert reply is not None  # (a scheduler test's sequence emits nothing)
        for token, logprob, from_draft, top in tokens:
            self.ids.append(token)
            delta, finish = reply.add(token)
            events.append(TokenEvent(token=token, text=delta, logprob=logprob, from_draft=from_draft,
                                     finish_reason=finish, top_logprobs=top))
            if finish:
                break
        if self.caches is not None:  # the blocks its caches filled become prefix hits
            self.caches.hash_blocks()
        self.handle.put(*events)
        return len(events), finish

    def finish(self, reason: str, stats_extra: dict | None = None) -> None:
        """Put the final event (``reason``: eos, length, stop or cancelled) with the request's figures;
        the caches go back to the pool, or to the caller with ``Request.keep_caches``."""
        handle, reply = self.handle, self.reply
        assert reply is not None  # (a scheduler test's sequence ends with nothing to say)
        disk_hits = self._time_prefill()
        self.hold_ids(feed=self.request.keep_caches)
        if self.request.keep_caches and self.caches is not None:
            handle.caches, self.caches = self.caches, None
        self.release()
        now = time.monotonic()
        count = reply.count
        first = self.first_token or now
        stats = GenerationStats(prompt_tokens=self.prompt_tokens, reused_tokens=self.prefix_hits,
                                prefill_tokens=self.computed_prompt + (self.first_token is not None),
                                prefill_seconds=first - self.arrival, generated_tokens=count,
                                decode_seconds=(self.last_token or first) - first,
                                finish_reason=reason, peak_memory_bytes=mx.get_peak_memory(),
                                disk_reused_tokens=disk_hits,
                                **self._draft_figures(count))
        if stats_extra:
            stats = replace(stats, **stats_extra)
        handle.put(FinalEvent(finish_reason=reason, text=reply.text, stats=stats))

    def _time_prefill(self) -> int:
        """Tell the disk tier what computing this prompt cost per token, its reads aside (it reads back only
        while reading measures faster: ``pool_disk.ReadOrCompute``); the prompt tokens read from disk."""
        target = self.caches.target if self.caches is not None else None
        if not isinstance(target, PagedCache) or target.pool.disk is None:
            return 0
        if self.first_token and self.started_at and not self.preemptions:
            seconds = self.first_token - self.started_at - target.disk_read_seconds
            target.pool.disk.pace.timed_compute(self.computed_prompt, seconds)
        read = min(target.disk_read_tokens, self.prefix_hits)
        target.disk_read_tokens, target.disk_read_seconds = 0, 0.0  # this request's: a chat's next turn starts anew
        return read

    def _draft_figures(self, count: int) -> dict:
        if self.speculative is None:
            return {"target_passes": count}
        c = self.speculative.counters
        return {"draft_proposed": c.proposed, "draft_accepted": c.accepted,
                "target_passes": c.rounds + count - c.round_tokens,
                "draft_lengths": tuple(c.draft_lengths),
                "drafter": self.speculative.drafter}

    def started(self, now: float) -> None:
        """A step works on it (the first call sets ``started_at``)."""
        if self.started_at is None:
            self.started_at = now

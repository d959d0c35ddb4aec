"""Carries out the scheduler's plans on the engine's models and paged caches: all the MLX work of batching.

What one ``step()`` does, with its diagram: docs/engine.md. Speculative rounds take one step each, so a
newcomer waits at most one round. Replies side by side need the paged pool (a hybrid model's: standard
caches, ``hybrid_batch.py``); one reply at a time may run on a rotating or standard cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING
from contextlib import contextmanager
from dataclasses import replace

import mlx.core as mx

from mlxcore import decision_clock
from mlxcore.batching.batch_forward import BatchDecoder
from mlxcore.batching.byte_account import ByteAccount
from mlxcore.batching.constraints import Constraint, Mask
from mlxcore.batching.decode_steps import DecodeSteps
from mlxcore.batching.errors import OverloadedError, PromptTooLongError
from mlxcore.batching.handle import RequestHandle
from mlxcore.batching.hybrid_batch import HybridBatchDecoder
from mlxcore.batching.policies import Policy
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.batching.request import Request
from mlxcore.batching.scheduler import Scheduler, StepPlan
from mlxcore.batching.sequence import Generated, Sequence
from mlxcore.batching.drafters import drafter_of
from mlxcore.batching.spec_rows import BatchRound
from mlxcore.batching.pool_account import NoPool, PoolAccount
from mlxcore.batching.tally import Tally
from mlxcore.blas import parallel_products
from mlxcore.chat_template import turn_marks
from mlxcore.decode_speculative import Emitted, SpeculativeDecoder
from mlxcore.draft_length import DraftLengthController
from mlxcore.errors import PromptError, UsageError
from mlxcore.kv.errors import PoolExhaustedError
from mlxcore.kv.hybrid import HybridCache
from mlxcore.params import GenerationParams
from mlxcore.buffer_cache import Clearing
from mlxcore.prefill import prefill, hold
from mlxcore.reply_text import ReplyText

if TYPE_CHECKING:  # the runner runs on an Engine it is given; Engine.generate runs the runner
    from mlxcore.engine import Engine

log = logging.getLogger("mlxchat.engine")
MAX_UNREAD = 64  # events a reply may have waiting for its reader before it is paused (memory stays bounded)
STALL_SECONDS = 60.0  # a paused reply whose reader takes nothing for this long is cancelled (blocks freed)


class BatchRunner:
    """Continuous batching on one engine; call everything from one thread (``worker.py`` makes it so)."""

    def __init__(self, engine: Engine, policy: Policy, *, step_tokens: int | None = None, max_running: int = 8,
                 stall_seconds: float = STALL_SECONDS) -> None:
        paged = engine.kv.kind == "paged"
        # A hybrid model batches whole (mlx-lm's layers) on standard caches; another model needs the paged one.
        self.hybrid = engine.hybrid and not paged
        if not engine.batches and max_running > 1:
            raise UsageError('Replies side by side need the paged KV cache (kind="paged"); a hybrid model\'s, '
                             'the standard one.')
        self.engine = engine
        self.decoder = HybridBatchDecoder(engine.model) if self.hybrid else BatchDecoder(engine.target_forward)
        # (``_turn_split``) the ids of <|im_start|> and <think>, for a hybrid model
        self._turn_marks = turn_marks(engine.tokenizer) if self.hybrid else None
        self.steps = DecodeSteps(engine.target_forward, self.decoder)
        self.account: PoolAccount | NoPool | ByteAccount = PoolAccount(engine) if paged else NoPool()
        if self.hybrid and engine.batches:  # (its caches in the KV budget: byte_account.py)
            self.account = ByteAccount(engine, lambda: self.scheduler.running)
        self.scheduler = Scheduler(policy, self.account, step_tokens=step_tokens, max_running=max_running)
        self.sequences: dict[str, Sequence] = {}  # a choice's request id -> the sequence the scheduler runs it in
        self.tally = Tally()
        self.feeds: list[tuple[Sequence, PromptFeed]] = []  # this step's prompt chunks
        # Prompts are read as rows of the batched pass (alone when nothing decodes, and on a cache of one
        # sequence); a hybrid model's, through its own layers, by ``prefill()``.
        self.feeds_prompts = engine.target_forward.split and not engine.hybrid
        self._cancelled: set[str] = set()
        self.clearing = Clearing()  # MLX's buffer cache, cleared as mlx-lm does (buffer_cache.py)
        self.stall_seconds = stall_seconds  # a reply whose reader read nothing for this long is cancelled
        self.max_unread: int | None = MAX_UNREAD  # None: never paused for its reader
        # Replies draft as rows of the step's pass (``spec_rows.py``), with the engine's drafter (``drafters.py``).
        self.drafter = drafter_of(engine)
        forward = self.drafter.forward if self.drafter is not None else None
        self.rows = bool(self.drafter is not None and (forward is None or forward.split) and self.feeds_prompts
                     and isinstance(self.decoder, BatchDecoder))
        self.keeps = self.drafter.keeps if self.drafter is not None and self.rows else ()
        self.steps.drafter = self.drafter if self.keeps else None  # plain steps keep them for it too
        self.steps.drafts = self._drafts
        # (replies, when, a round?) of the end of the last step with a draft that read no prompt rows: a step's
        # time, plain or a round, runs from there to its tokens emitted, so the controller compares like with like
        self._step_clock: tuple[int, float, bool] | None = None

    # requests ---------------------------------------------------------------

    def submit(self, request: Request, handles: list[RequestHandle]) -> None:
        """Queue ``request``; one handle per choice (several share the prompt's blocks)."""
        try:
            self.engine._check_prompt(request.prompt_ids)
        except PromptError as error:
            raise PromptTooLongError(str(error)) from None
        now = decision_clock.now()
        cap = self.engine.reply_cap(request.params, len(request.prompt_ids))
        choices = [Sequence(request, now, cap, handle, _choice_params(request, i),
                            ReplyText(self.engine.tokenizer, () if request.params.ignore_eos else self.engine.eos_ids,
                                      request.params.stop, cap),
                            self._constraint(request)) for i, handle in enumerate(handles)]
        seq, seq.followers = choices[0], choices[1:]
        for handle in handles:
            self.sequences[handle.request_id] = seq  # (a follower's own object: in ``seq.followers``)
        self.scheduler.add(seq)

    def _constraint(self, request: Request) -> Mask | None:
        """A matcher for the request's grammar (``ValueError`` if llguidance cannot compile it), closing the
        reply before its token cap; the tests' and the bench's scripted replies put their own mask here."""
        if request.grammar is None:
            return None
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise UsageError("A grammar needs the model's tokenizer, and this engine has none.")
        eos = self.engine.eos_ids or set(tokenizer.eos_token_ids)  # (benches clear eos_ids)
        return Constraint(request.grammar, tokenizer, self.engine.model.args.vocab_size, eos,
                          request.prompt_ids, None if request.params.ignore_eos else
                          self.engine.reply_cap(request.params, len(request.prompt_ids)))

    def _unstick(self, plan: StepPlan) -> None:
        """Nothing runs and nothing was admitted, yet requests wait: memory held outside the scheduler (other
        chats' caches, cached prefixes) keeps them out. Cached prefixes are given back first; a request that
        still does not fit fails with ``OverloadedError`` (retry later) rather than wait forever."""
        scheduler = self.scheduler
        if plan.admitted or plan.prefill:
            return
        self.engine.kv_budget.reclaim()
        for seq in list(scheduler.waiting):  # (a prompt over what the pool holds for one chat was refused at submit)
            if self.account.needed(seq, seq.length) > self.account.obtainable():
                self._end_unfit(seq, OverloadedError(
                    f"The KV cache cannot take this {seq.length:,}-token prompt next to what other chats hold "
                    f"now in {self.engine.kv_room()[1]}: try again later, close other chats, or give more memory "
                    "(max_kv).",
                    retry_after=5.0))

    def _end_unfit(self, seq: Sequence, error: BaseException | None = None) -> None:
        """``seq`` needs more KV memory than there is with nobody else to preempt: a reply ends there, as at
        its token cap; a prompt not yet answered fails with ``error``, by default what is full."""
        if seq.generated:
            self._end(seq, reason="length")
        else:
            self._end(seq, error=error or PromptTooLongError(
                self.engine.pool("target").full_message(1) if self.engine.kv.kind == "paged" else
                f"The KV cache cannot hold this prompt and its reply in {self.engine.kv_room()[1]}: give more "
                "memory (max_kv), or start a new chat."))

    def cancel(self, request_id: str) -> None:
        """Stop a request at the next step (its blocks are free after it)."""
        self._cancelled.add(request_id)

    @property
    def busy(self) -> bool:
        return self.scheduler.busy or bool(self._cancelled) or self.steps.pending

    def fail_all(self, error: BaseException) -> None:
        """The engine failed: every request's stream ends with the error, and its caches go back."""
        self.fail_running(error)
        for seq in list(self.scheduler.waiting):
            self._end(seq, error=error)

    def fail_running(self, error: BaseException) -> None:
        """A step failed where no one request was to blame (a batched pass): the requests it ran end with
        ``error`` and their caches go back; those waiting go on. The batch's state is dropped."""
        self.steps.last = None
        for seq in list(self.scheduler.running):
            self._end(seq, error=error)
        self._release_mirrors()
        self.feeds = []

    def _release_mirrors(self) -> None:
        """The batch's mirrors of the pools (``batch_mirror.py``), the target's and the draft's, go back to the
        budget."""
        self.decoder.release()
        if self.drafter is not None:
            self.drafter.release()

    @contextmanager
    def _alone(self, seq: Sequence) -> Iterator[None]:
        """Work on ``seq`` alone: whatever it raises ends that request, with the error, and nothing else."""
        try:
            yield
        except Exception as error:
            log.exception("request %s failed; the engine goes on", seq.group)
            self._end(seq, error=error)

    def _pause_unread(self, now: float) -> None:
        """Back-pressure: a reply whose reader has ``max_unread`` events waiting is not decoded until it
        reads; one that reads nothing for ``stall_seconds`` is cancelled, its blocks freed."""
        assert self.max_unread is not None  # (``step`` asks only then)
        for seq in list(self.scheduler.running):
            unread = seq.handle.unread
            for follower in seq.followers:  # (a prompt being read for several choices)
                unread = max(unread, follower.handle.unread)
            if unread <= self.max_unread:
                seq.paused_since = None
            elif seq.paused_since is None:
                seq.paused_since = now
                self._emit_pending(seq)  # its pending pick is a real token: emitted before it waits
            elif now - seq.paused_since > self.stall_seconds:  # the whole request: its reader is gone
                log.warning("request %s: its client read nothing for %.0f s; cancelled", seq.group,
                            now - seq.paused_since)
                self._cancelled.update(rid for rid, other in self.sequences.items() if other.group == seq.group)

    @property
    def paused(self) -> bool:
        """Every running reply waits for its reader (the worker may sleep a little)."""
        running = self.scheduler.running
        return bool(running) and all(seq.paused_since is not None for seq in running)

    def abandon(self) -> None:
        """A step stopped part way (an exception out of ``step``: Ctrl+C, a failed pass): each reply's
        caches are made to hold its ids (a prompt read in part keeps what every layer holds), handed
        back with ``keep_caches`` or released. The runner is not stepped again."""
        self.steps.last = None
        for seq in {id(seq): seq for seq in self.sequences.values()}.values():
            seq.hold_ids(feed=seq.request.keep_caches)
            if seq.request.keep_caches:
                seq.handle.caches, seq.caches = seq.caches, None
            seq.release()
        self.sequences.clear()

    # what progress reads of a request ----------------------------------------

    def tokens_read(self, request_id: str) -> int | None:
        """Tokens of the request's ids (prompt, then reply) its caches hold; None once it ended."""
        seq = self.sequences.get(request_id)
        return seq.cached if seq is not None else None

    # one step ---------------------------------------------------------------

    def step(self) -> None:
        start = decision_clock.now()
        if self._cancelled:
            self._apply_cancellations()
        if self.max_unread is not None:
            self._pause_unread(start)
        if self.engine.draft_model is not None:
            self._spare_drafts()
        plan = self.scheduler.plan(start)
        if self.scheduler.waiting and not self.scheduler.running:
            self._unstick(plan)
        for seq in plan.preempted:
            if self.scheduler.running:
                self._preempted(seq)
            else:  # it ran alone and its next token does not fit: it could never come back
                self._end_unfit(seq)
        for seq in plan.late:
            for each in seq.with_followers:
                each.late = True
        sequences = self.sequences  # (``_alive``, read here: a step asks it of every reply)
        decoding = [seq for seq in plan.decode if sequences.get(seq.request_id) is seq]
        for seq, count in plan.prefill:
            with self._alone(seq):
                self._read_prompt(seq, count, start)
        feeds: list[PromptFeed] = []
        if self.feeds:
            self.feeds = [(seq, feed) for seq, feed in self.feeds if self._alive(seq)]
            feeds = [feed for _, feed in self.feeds]
        if feeds and not decoding:  # a pass of prompt rows alone
            assert isinstance(self.decoder, BatchDecoder)  # (a hybrid model's prompts are read by ``prefill()``)
            with parallel_products():  # large products, every thread
                self.decoder([], None, feeds)
                mx.eval([feed.h for feed in feeds])  # the last layer's rows hold every layer's writes
        # a lone reply (nobody else runs or waits) may decode speculatively
        lone = len(plan.decode) == 1 and not plan.prefill and len(self.scheduler.running) == 1 \
            and not self.scheduler.waiting
        decoded = self._decode(decoding, lone, feeds if decoding else [])
        if self.feeds:
            self._read_chunks()
        if not self.scheduler.running:
            self._release_mirrors()
        self.clearing.after_step(bool(plan.prefill), idle=not self.scheduler.running)
        seconds = decision_clock.now() - start
        self.tally.step(len(plan.decode), decoded, seconds)
        if decoded:
            self.scheduler.step_seconds = seconds

    def _spare_drafts(self) -> None:
        """Draft caches are the first KV memory to go: when the running replies' next tokens need more blocks
        than the target's pool can get, each reply with a draft cache gives it back and decodes on without
        (rather than a reply being preempted, or ended, for want of what its own draft holds)."""
        drafted = [seq for seq in self.scheduler.running if seq.caches is not None and seq.caches.draft is not None]
        if not drafted:
            return
        need = sum(self.account.needed(seq, 1) for seq in self.scheduler.running if seq.ready)
        if need <= self.account.obtainable():
            return
        for seq in drafted:
            log.info("request %s: the KV memory its draft holds is wanted; it decodes on without the draft",
                     seq.group)
            seq.leave_draft()

    # prefill ----------------------------------------------------------------

    def _read_prompt(self, seq: Sequence, count: int, now: float) -> None:
        """Read up to ``count`` more tokens of ``seq``'s prompt (its caches attached first): a chunk of rows of
        this step's pass (``PromptFeed``), through every layer; a hybrid model's, by ``prefill()`` through its
        own layers, in prefill chunks."""
        seq.started(now)
        try:
            if seq.caches is None:
                self._attach(seq)
            if self.feeds_prompts:
                self._start_feed(seq, count)
            else:
                self._prefill(seq, count)
        except PoolExhaustedError as error:
            self._refused(seq, error)
            return
        if seq.prefill_left == 0 and seq.followers:
            self._fork(seq)

    def _start_feed(self, seq: Sequence, count: int) -> None:
        """Announce the next chunk of ``seq``'s prompt: the step's budget gave it ``count`` tokens, a request's
        own ``prefill_chunk`` at most (``Engine.generate``'s: its progress is told a chunk at a time)."""
        count = min(count, seq.prefill_left, seq.params.prefill_chunk or count)
        if count and seq.caches is not None:
            self.feeds.append((seq, PromptFeed(self.engine.target_forward, seq.caches.target,
                                               seq.ids[seq.cached:seq.cached + count],
                                               keep=self.keeps if self._drafts(seq) else ())))

    def _read_chunks(self) -> None:
        """This step's chunks went through every layer: their caches hold them; a prompt read in full forks
        for its choices."""
        feeds, self.feeds = self.feeds, []
        for seq, feed in feeds:
            if not self._alive(seq) or seq.caches is None:
                continue
            feed.ran()
            if feed.keep and self.drafter is not None:  # a block drafter reads the prompt's hidden states
                self.drafter.took([(seq, feed.start, len(feed.ids))], feed.kept)
            seq.computed_prompt += len(feed.ids)
            seq.caches.hash_blocks()
            if seq.prefill_left == 0 and seq.followers:
                self._fork(seq)

    def _prefill(self, seq: Sequence, count: int) -> None:
        """Read the next ``count`` tokens of ``seq``'s prompt now, by ``prefill()``."""
        assert seq.caches is not None  # attached
        target = seq.caches.target
        ids = seq.ids[seq.cached:seq.cached + min(count, seq.prefill_left)]
        split = self._turn_split(seq, len(ids))
        for n, part in enumerate([ids[:split], ids[split:]] if split else [ids]):
            if n and isinstance(target, HybridCache):  # where the prompt's last turn opens
                target.snapshot()
            prefill(self.engine.target_forward, target, part, self.engine.prefill_chunk(seq.params))
            seq.computed_prompt += len(part)

    def _turn_split(self, seq: Sequence, count: int) -> int:
        """Where, in the next ``count`` tokens of ``seq``'s prompt to read, a hybrid model's cache takes a snapshot
        (0: nowhere): where the prompt's last turn opens, when that turn starts with a think block (thinking
        off: an empty one). An API client's next request renders this turn without it, so its history agrees
        with this prompt up to that turn's header: a kept cache goes back to that snapshot
        (``hybrid_prefixes.py``). With thinking on, the prompt's end serves (``HybridCache``)."""
        if self._turn_marks is None:
            return 0
        turn_start, think = self._turn_marks
        prompt = seq.ids[:seq.prompt_tokens]
        starts = [at for at, token in enumerate(prompt) if token == turn_start]
        if not starts or think not in prompt[starts[-1]:]:
            return 0
        split = starts[-1] - seq.cached
        return split if 0 < split < count else 0

    def _attach(self, seq: Sequence) -> None:
        """Caches for a (re)admitted sequence: the ones the request came with, kept up to their common
        prefix with its ids (``Engine.keep_prefix``), else new ones holding every block of its ids found
        in the pool."""
        given = seq.request.caches if not seq.admitted_once else None
        if given is not None:
            caches = seq.caches = given
            hits = self.engine.keep_prefix(given, seq.ids)
        else:
            caches = seq.caches = self.engine.new_caches()
            hits = caches.target.reuse_prefix(seq.ids)
            if caches.draft is not None:  # the draft's blocks of a chat it decoded before
                caches.draft.reuse_prefix(seq.ids)
        if given is None and caches.draft is not None and not self._drafts(seq):
            caches.draft.release()  # (a chat's own draft cache stays with it, for its next turns)
            caches.draft = None
        caches.ids = seq.ids  # one list: the caches hold its first tokens
        if not seq.admitted_once:
            seq.admitted_once = True
            seq.prefix_hits = hits
            self.tally.prompt(len(seq.ids), hits)

    def _refused(self, seq: Sequence, error: PoolExhaustedError) -> None:
        """The pool could not take a prompt chunk: wait for room, or fail when nothing else could make any."""
        seq.release()
        self.scheduler.remove(seq)
        if self.scheduler.running:
            self.scheduler.add(seq)
            return
        self._end_unfit(seq, PromptTooLongError(str(error)))

    def _fork(self, seq: Sequence) -> None:
        """The prompt is read: one sequence per choice, each on caches sharing its blocks."""
        children, seq.followers = seq.with_followers, []
        for child in children[1:]:
            child.fork_from(seq)
            self.sequences[child.request_id] = child
        slots = max(self.scheduler.max_running - len(self.scheduler.running) + 1, 1)
        self.scheduler.replace(seq, children[:slots])
        for child in children[slots:]:  # n counts against --max-running: the rest wait for slots, their
            child.release()  # prompt's blocks cached (a prefix hit when admitted)
            self.scheduler.add(child)

    # decode -----------------------------------------------------------------

    def _decode(self, seqs: list[Sequence], lone: bool, feeds: list[PromptFeed]) -> int:
        """One token for each of ``seqs`` (queued; read next step, ``decode_steps.py``) with ``feeds`` riding
        in the pass; when drafting pays, a speculative round for each reply with a draft instead, as rows of
        the step's pass (``spec_rows.py``; a lone reply of a model not run split here: by
        ``SpeculativeDecoder.round``); tokens emitted."""
        control = self._draft_control(seqs, lone)
        k = control.choose() if control is not None else 0
        if k and not self.rows:  # a lone reply of a model not run split here (a hybrid one)
            assert control is not None  # (k came from it)
            with self._alone(seqs[0]):
                self._speculative(seqs[0]).counters.draft_lengths.append(k)
                return self._emit_pending(seqs[0]) + self._round(seqs[0], k, control)
            return 0  # it failed, and ended
        start, emitted, rounds = 0.0, 0, None
        plain = seqs
        if k:
            clock = self._step_clock
            start = clock[1] if clock is not None and clock[0] == len(seqs) else decision_clock.now()
            emitted, rounds = self._start_rounds(seqs, k)
            # (emitting the drafting replies' pending picks may have ended some)
            drafting = set(map(id, rounds.drafting)) if rounds is not None else set()
            plain = [seq for seq in seqs if id(seq) not in drafting and self._alive(seq)]
        rows = feeds + (rounds.verify if rounds is not None else [])
        if plain:
            self.steps.queue(plain, rows)
        elif rows:  # every decoding reply drafts: the pass is their rounds' rows (and prompt chunks)
            assert isinstance(self.decoder, BatchDecoder)  # (``self.rows``)
            self.decoder([], None, rows)
        for seq, token, logprob, top in self.steps.advance():
            if seq.constraint is not None and seq.constraint.failed is not None:  # never a token past it
                self._end(seq, error=seq.constraint.failed)
                continue
            emitted += self._emitted(seq, [(token, logprob, False, top)])
        if rounds is not None and control is not None:
            emitted += self._finish_rounds(rounds, control, None if feeds else start)
        elif control is not None and not k:  # the controller compares a round's tokens per second with a plain step's
            clock = self._step_clock
            # (the first plain step after a round reads no pick: it waits for no pass, so it is not a step's time)
            if clock is not None and clock[0] == len(seqs) and not clock[2] and not feeds:
                control.observe_plain(decision_clock.now() - clock[1])
        # A step whose pass carried prompt rows is not timed, nor is the next, which waits for that pass: a reply
        # beside a prompt being read would learn that its steps are slow, and draft at a loss (plain) or not draft
        # when it pays (a round). A step without the controller breaks the chain (it may be long ago).
        self._step_clock = None if control is None or feeds else (len(seqs), decision_clock.now(), rounds is not None)
        return emitted

    def _draft_control(self, seqs: list[Sequence], lone: bool) -> DraftLengthController | None:
        """The draft-length controller of this step's batch size, when a reply of it may draft: a lone one, or
        replies side by side as rows of the step's pass (a model run split here, ``spec_rows.py``)."""
        if self.drafter is None or not (lone or self.rows) or not any(self._drafts(seq) for seq in seqs):
            return None
        return self.engine.draft_control.for_rows(len(seqs))

    def _start_rounds(self, seqs: list[Sequence], k: int) -> tuple[int, BatchRound | None]:
        """Emit the drafting replies' pending picks, then queue their drafts and announce their verifying rows
        (``spec_rows.py``); tokens emitted, and the round (None when nobody drafts after all: a round that
        does not fit in the pools gives the drafts back, and every reply decodes plainly)."""
        drafting = [seq for seq in seqs if self._drafts(seq)]
        emitted = sum(self._emit_pending(seq) for seq in drafting)
        drafting = [seq for seq in drafting if self._alive(seq)]
        if not drafting:
            return emitted, None
        assert self.rows and self.drafter is not None  # (``_draft_control``)
        control = self.engine.draft_control.for_rows(len(seqs))
        for seq in drafting:
            decoder = self._speculative(seq)
            decoder.counters.draft_lengths.append(k)
            assert seq.caches is not None  # a decoding reply's
            if seq.constraint is not None:
                seq.constraint.catch_up(seq.reply_ids)  # the round's masks follow what was emitted
            self.drafter.catch_up(seq, decoder, control)
        start = decision_clock.now()
        try:
            rounds = BatchRound(self.engine.target_forward, self.drafter, drafting, k)
            if control.draft_timing_due():  # now and then: one more sync, to learn what a draft pass costs
                mx.eval([drafted for drafted, _ in rounds.proposals])
                rounds.draft_seconds = decision_clock.now() - start
        except PoolExhaustedError:  # no room for the rounds (other chats hold the rest): on without the drafts
            log.info("no KV room for the batch's draft rounds; %d replies decode on without the draft",
                     len(drafting))
            for seq in drafting:
                assert seq.caches is not None  # a decoding reply's
                hold(seq.caches.target, seq.ids)  # an announced verification dropped
                seq.leave_draft()
            return emitted, None
        return emitted, rounds if rounds.drafting else None

    def _finish_rounds(self, rounds: BatchRound, control: DraftLengthController, start: float | None) -> int:
        """The batch's rounds after the step's pass: each reply's verdict emitted; tokens emitted. The round is
        timed from ``start`` to its tokens emitted, as a plain step is (None: not timed), the draft's catch-up
        included: a reply that joins a batch that drafts costs its prompt's reading by the draft too."""
        verdicts = rounds.verdicts(self.engine.target_forward)
        emitted = sum(self._emit_round(seq, tokens) for seq, (_, _, tokens) in zip(rounds.drafting, verdicts))
        control.observe_round(rounds.k, [n for _, n, _ in verdicts],
                              None if start is None else decision_clock.now() - start,
                              rounds.draft_seconds, proposed=[k for k, _, _ in verdicts])
        return emitted

    def _emit_round(self, seq: Sequence, tokens: list[Emitted]) -> int:
        """Emit a round's tokens for ``seq`` up to where its reply ends; tokens emitted."""
        done = self._emitted(seq, [(token, logprob, from_draft, ()) for token, logprob, from_draft in tokens])
        if done < len(tokens):  # the reply ended there: the rest are not its tokens
            assert seq.speculative is not None
            seq.speculative.counters.round_tokens -= len(tokens) - done
        return done

    def _emit_pending(self, seq: Sequence) -> int:
        """Emit ``seq``'s pending pick now (before it leaves batched decoding); tokens emitted."""
        read = self.steps.take_pending(seq)
        if read is None:
            return 0
        seq, token, logprob, top = read
        return self._emitted(seq, [(token, logprob, False, top)])

    def _preempted(self, seq: Sequence) -> None:
        """Let go of a preempted sequence's caches (its pending pick emitted first: it is a real token)."""
        self._emit_pending(seq)
        if not self._alive(seq):  # that token ended its reply
            return
        for each in seq.with_followers:
            each.release()
            each.preemptions += 1
            self.tally.preemptions += 1

    def _speculative(self, seq: Sequence) -> SpeculativeDecoder:
        if seq.speculative is None:
            assert self.drafter is not None  # (``_drafts``)
            seq.speculative = SpeculativeDecoder(self.engine.target_forward, self.drafter, seq.params,
                                                 self.engine.draft_control, seq.constraint)
        return seq.speculative

    def _round(self, seq: Sequence, k: int, control: DraftLengthController) -> int:
        """One speculative round for ``seq`` (its pending pick emitted first); tokens emitted. Timed as a batch's
        round is, from the last step's end to its tokens emitted."""
        clock, self._step_clock = self._step_clock, None
        start = clock[1] if clock is not None and clock[0] == 1 else decision_clock.now()
        if not self._alive(seq):  # that pick ended it
            return 0
        decoder, caches = seq.speculative, seq.caches
        # (``_speculative`` made it; a running reply's caches, with the draft's: ``_drafts``)
        assert decoder is not None and caches is not None and caches.draft is not None
        if seq.constraint is not None:
            seq.constraint.catch_up(seq.reply_ids)  # the round's masks follow what was emitted
        try:
            tokens, draft_seconds = decoder.round(caches.target, caches.draft, seq.ids, k)
        except PoolExhaustedError:  # no room for a round (other chats hold the rest): on without the draft
            log.info("request %s: no KV room for a draft round; it decodes on without the draft", seq.group)
            seq.leave_draft()
            return 0
        emitted = self._emit_round(seq, tokens)
        now = decision_clock.now()
        control.observe_round(k, min(sum(drafted for _, _, drafted in tokens), k), now - start, draft_seconds)
        self._step_clock = (1, now, True)
        return emitted

    def _drafts(self, seq: Sequence) -> bool:
        """Whether this reply may decode speculatively: with the draft model (while its draft cache is
        kept), or a drafter without a model of its own (prompt lookup, a block drafter: on a model run split
        here)."""
        if not seq.request.use_draft or seq.params.repetition_penalty != 1.0 or seq.request.top_logprobs:
            return False
        drafter = self.drafter
        return drafter is not None and (self.rows or drafter.forward is not None) and drafter.may_draft(seq)

    def _alive(self, seq: Sequence) -> bool:
        """Whether ``seq`` is still the sequence its request id runs in (not ended, not handed on)."""
        return self.sequences.get(seq.request_id) is seq

    def _emitted(self, seq: Sequence, tokens: list[Generated]) -> int:
        """Emit ``tokens`` for ``seq`` up to one that ends its reply (then it ends); tokens emitted."""
        done, finish = seq.emit(tokens)
        self.tally.tokens += done
        if finish:
            self.steps.drop(seq)
            self._end(seq, reason=finish)
        return done

    # endings ----------------------------------------------------------------

    def _apply_cancellations(self) -> None:
        for request_id in list(self._cancelled):
            seq = self.sequences.get(request_id)
            if seq is not None:
                self._cancel_one(seq, request_id)
        self._cancelled.clear()

    def _cancel_one(self, seq: Sequence, request_id: str) -> None:
        """Cancel one choice. Of a prompt not read yet, the others go on: a follower just leaves, and the
        one reading the prompt hands it (and the other followers) to the next choice."""
        self.steps.drop(seq)
        if not seq.followers:
            self._end(seq, reason="cancelled")
            return
        if request_id == seq.request_id:
            heir, heir.followers, seq.followers = seq.followers[0], seq.followers[1:], []
            heir.admitted, heir.first_scheduled = seq.admitted, seq.first_scheduled
            self.scheduler.swap(seq, heir)
            for each in heir.with_followers:
                self.sequences[each.request_id] = heir
            gone = seq  # its caches go back: the heir attaches its own (the prompt's blocks are a prefix hit)
        else:
            gone = next(each for each in seq.followers if each.request_id == request_id)
            seq.followers.remove(gone)
        del self.sequences[request_id]
        self.tally.ended("cancelled", gone.late)
        gone.finish("cancelled")

    def _end(self, seq: Sequence, reason: str = "", error: BaseException | None = None) -> None:
        """End ``seq`` (and the followers of a prompt not read yet) with ``reason``, or fail it with ``error``."""
        self.scheduler.remove(seq)
        if not self._alive(seq):  # ended already
            return
        for each in seq.with_followers:
            self.sequences.pop(each.request_id, None)
            self.steps.drop(each)
            if error is not None:
                self._fail(each, error)
                continue
            try:
                each.finish(reason, self.engine._kv_stats())
            except Exception as failed:  # settling its caches failed (a full pool): the reply fails with it
                log.exception("request %s failed as it ended", seq.group)
                self._fail(each, failed)
                continue
            self.tally.ended(reason, each.late)

    def _fail(self, seq: Sequence, error: BaseException) -> None:
        if seq.request.keep_caches and seq.caches is not None:  # the caller's, as they stand
            seq.handle.caches, seq.caches = seq.caches, None
        try:
            seq.release()
        except Exception:  # caches that cannot hold its ids (a failed pass): they go back as they are
            log.exception("request %s: its caches could not hold its ids", seq.request_id)
        seq.handle.fail(error)
        self.tally.failed += 1


def _choice_params(request: Request, index: int) -> GenerationParams:
    """Choice ``index``'s sampling: the request's, with the seed moved on by ``index`` when one is given."""
    params = request.params
    if index and params.seed is not None:
        return replace(params, seed=params.seed + index)
    return params

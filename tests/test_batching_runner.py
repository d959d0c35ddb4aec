"""Continuous batching on the embedded target: every request's tokens equal the same request run alone.

The reference is ``Engine.generate`` on one request at a time (greedy, or sampled
with the same seed). Requests differ in prompt length, join at different steps,
are cancelled, preempted and resumed, share a prompt as several choices, and a
lone one decodes speculatively.
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import pytest

from mlxcore.batching import decode_steps
from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from mlxcore.sampling import TokenPicker
from bench.batch_load import stream_prompt
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams

TARGET, DRAFT = load_model("mini-target"), load_model("mini-draft")
VOCAB = TARGET.model.args.vocab_size


def engine(draft: bool = False, max_kv_bytes: int | None = None) -> Engine:
    made = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind="paged", max_kv_bytes=max_kv_bytes),
                  draft_model=DRAFT.model if draft else None)
    made.eos_ids = set()  # replies run to max_tokens: long enough to cross steps and blocks
    return made


def alone(prompt: list[int], params: GenerationParams) -> list[int]:
    reference = engine()
    return [e.token for e in reference.generate(prompt, reference.new_caches(), params) if isinstance(e, TokenEvent)]


CHUNKED = 40  # a step's token budget small enough that a few hundred prompt tokens take several steps


def prompt(stream: int, length: int) -> list[int]:
    return stream_prompt(VOCAB, stream, length)


class Collector:
    """Every handle's events, taken after each step."""

    def __init__(self, batch: LocalBatch) -> None:
        self.batch, self.events = batch, {}

    def submit(self, request: Request, n: int = 1):
        handles = self.batch.submit(request, n)
        for handle in handles:
            self.events[handle.request_id] = (handle, [])
        return handles

    def step(self, count: int = 1) -> None:
        for _ in range(count):
            if self.batch.busy:
                self.batch.step()
            for handle, events in self.events.values():
                events.extend(drain(handle))

    def run(self) -> None:
        while self.batch.busy:
            self.step()

    def tokens(self, handle) -> list[int]:
        return [e.token for e in self.events[handle.request_id][1] if isinstance(e, TokenEvent)]

    def final(self, handle) -> FinalEvent:
        events = self.events[handle.request_id][1]
        assert isinstance(events[-1], FinalEvent), "the stream ends with a final event"
        return events[-1]


def test_batches_joining_at_different_steps_with_one_cancelled_equal_each_alone():
    batch = Collector(LocalBatch(engine(), max_running=8, step_tokens=CHUNKED))
    params = GenerationParams(max_tokens=40)
    prompts = [prompt(s, 9 + 23 * s) for s in range(8)]
    handles = [batch.submit(Request(tuple(p), params))[0] for p in prompts[:3]]
    batch.step(5)
    handles += [batch.submit(Request(tuple(p), params))[0] for p in prompts[3:6]]
    batch.step(7)
    cancelled = handles[1]
    cancelled.cancel()
    handles += [batch.submit(Request(tuple(p), params))[0] for p in prompts[6:]]
    batch.run()
    for index, (handle, p) in enumerate(zip(handles, prompts)):
        expected = alone(p, params)
        if handle is cancelled:
            got = batch.tokens(handle)
            assert batch.final(handle).finish_reason == "cancelled" and 0 < len(got) < 40
            assert got == expected[:len(got)], "what a cancelled request got is what it would have got"
            continue
        assert batch.tokens(handle) == expected, f"request {index} differs from the same request alone"
        assert batch.final(handle).finish_reason == "length"
    assert batch.batch.runner.tally.largest_batch >= 4, "they decoded together"
    runner = batch.batch.runner
    assert runner.decoder.mirror is not None, "the batch was read from a mirror"
    assert runner.decoder.mirror.bytes == 0, "with nothing decoding, the mirror's memory went back"
    assert runner.engine.kv_budget.in_use == sum(pool.bytes_allocated for pool in runner.engine.pools.values())


def test_a_replys_caches_hold_its_ids_and_its_written_blocks_are_hits_at_once():
    """One list of ids for a reply and its caches (``Caches.ids``): after every step it is the prompt and the
    tokens emitted, and every full block of them that every layer holds is a prefix hit for the next request
    (told as each token is emitted and each prompt chunk read), before the reply ends."""
    made = engine()
    batch = Collector(LocalBatch(made, max_running=4, step_tokens=24))  # the prompt in a few chunks
    p = prompt(3, 70)
    handle = batch.submit(Request(tuple(p), GenerationParams(max_tokens=40)))[0]
    pool, hits = made.pools["target"], set()
    while batch.batch.busy:
        batch.step()
        seq = batch.batch.runner.sequences.get(handle.request_id)
        if seq is None or seq.caches is None:  # it ended
            break
        caches = seq.caches
        assert caches.ids == p + batch.tokens(handle)
        held = min(len(caches.ids), caches.target.offset)
        hit = pool.manager.cached_prefix(caches.ids[:held] + [0])[0]
        assert hit == held // pool.block_size * pool.block_size, (held, hit)
        hits.add(hit)
    assert len(batch.tokens(handle)) == 40 and len(hits) >= 5, hits


def test_a_cancelled_requests_blocks_are_free_after_the_next_step():
    made = engine()
    batch = Collector(LocalBatch(made))
    params = GenerationParams(max_tokens=200)
    keep, drop = (batch.submit(Request(tuple(prompt(s, 100)), params))[0] for s in (1, 2))
    batch.step(6)
    pool = made.pool("target")
    both = pool.stats().used_blocks
    drop.cancel()
    batch.step(1)
    assert pool.stats().used_blocks < both
    assert pool.stats().used_blocks == len(pool.manager.block_ids(
        batch.batch.runner.sequences[keep.request_id].caches.target.seq_id))
    keep.cancel()
    batch.run()
    assert pool.stats().used_blocks == 0


@pytest.mark.parametrize("seed", [None, 7])
def test_preempted_requests_resume_with_unchanged_output(seed):
    made = engine(max_kv_bytes=260_000)  # ~84 tokens of the target's KV: three requests cannot all run
    batch = Collector(LocalBatch(made))
    params = GenerationParams(max_tokens=30, temperature=0.0 if seed is None else 0.8, seed=seed)
    prompts = [prompt(s, 30 + 5 * s) for s in range(3)]
    handles = [batch.submit(Request(tuple(p), params))[0] for p in prompts]
    batch.run()
    assert batch.batch.runner.tally.preemptions > 0, "the budget made the scheduler preempt"
    for handle, p in zip(handles, prompts):
        assert batch.tokens(handle) == alone(p, params)
    assert made.kv_budget.peak <= made.kv_budget.limit


def test_choices_share_the_prompts_blocks_and_follow_their_seeds():
    made = engine()
    batch = Collector(LocalBatch(made))
    p = prompt(3, 160)
    params = GenerationParams(max_tokens=12, temperature=0.9, seed=11)
    handles = batch.submit(Request(tuple(p), params), n=3)
    while not any(batch.tokens(h) for h in handles):
        batch.step()
    pool = made.pool("target")
    # the 10 blocks of the prompt are held once; each choice has its own copy of the partial last one and,
    # with the next step queued, one new block (3 separate prompts would hold 30 and more)
    assert pool.stats().used_blocks <= 160 // 16 + 2 * 3, "the prompt's blocks are held once"
    batch.run()
    for index, handle in enumerate(handles):
        assert batch.tokens(handle) == alone(p, GenerationParams(max_tokens=12, temperature=0.9, seed=11 + index))
    assert len({tuple(batch.tokens(h)) for h in handles}) > 1


@pytest.mark.parametrize("cancelled", [(0,), (2,), (0, 2)])
def test_choices_cancelled_while_their_prompt_is_read_leave_the_others_as_alone(cancelled):
    """Cancelling the choice that reads the prompt hands the prompt to the next one; cancelling another just
    drops it. The choices left answer as each alone (with its seed), and every block goes back."""
    made = engine()
    batch = Collector(LocalBatch(made, step_tokens=CHUNKED))
    running = batch.submit(Request(tuple(prompt(42, 20)), GenerationParams(max_tokens=400)))[0]
    batch.step(3)
    p, params = prompt(43, 300), GenerationParams(max_tokens=10, temperature=0.9, seed=5)
    handles = batch.submit(Request(tuple(p), params), n=3)
    while not part_read(batch, handles[0], len(p)):
        batch.step(1)
    for index in cancelled:
        handles[index].cancel()
    while not all(batch.events[h.request_id][1] and isinstance(batch.events[h.request_id][1][-1], FinalEvent)
                  for h in handles):
        batch.step(1)
    running.cancel()
    batch.run()
    for index, handle in enumerate(handles):
        if index in cancelled:
            assert batch.final(handle).finish_reason == "cancelled" and not batch.tokens(handle)
        else:
            assert batch.tokens(handle) == alone(p, GenerationParams(max_tokens=10, temperature=0.9, seed=5 + index))
    assert made.pool("target").stats().used_blocks == 0


def test_a_lone_request_decodes_speculatively_and_a_second_one_joins_batched():
    made = engine(draft=True)
    batch = Collector(LocalBatch(made))
    params = GenerationParams(max_tokens=60)
    text = TARGET.tokenizer.encode("Once upon a time there was a little cat who liked to play in the garden.")
    first = batch.submit(Request(tuple(text), params))[0]
    batch.step(20)
    second = batch.submit(Request(tuple(prompt(5, 50)), params))[0]
    batch.run()
    for handle, p in ((first, text), (second, prompt(5, 50))):
        assert batch.tokens(handle) == alone(p, params)
    drafted = [e for e in batch.events[first.request_id][1] if isinstance(e, TokenEvent) and e.from_draft]
    assert drafted, "alone, the first request took draft tokens"
    stats = batch.final(first).stats
    assert stats.draft_accepted >= len(drafted) and stats.draft_proposed >= stats.draft_accepted


def test_top_logprobs_are_the_likeliest_tokens_in_order():
    batch = Collector(LocalBatch(engine()))
    handle = batch.submit(Request(tuple(prompt(6, 20)), GenerationParams(max_tokens=5), top_logprobs=4))[0]
    batch.run()
    for event in (e for e in batch.events[handle.request_id][1] if isinstance(e, TokenEvent)):
        ids, values = zip(*event.top_logprobs)
        assert len(ids) == 4 and list(values) == sorted(values, reverse=True)
        assert ids[0] == event.token and values[0] == pytest.approx(event.logprob, abs=1e-4)


def test_the_final_event_reports_the_prefix_hit_of_a_shared_prompt():
    batch = Collector(LocalBatch(engine()))
    p = prompt(7, 100)
    first = batch.submit(Request(tuple(p), GenerationParams(max_tokens=3)))[0]
    batch.run()
    second = batch.submit(Request(tuple(p + [5, 6]), GenerationParams(max_tokens=3)))[0]
    batch.run()
    assert batch.final(first).stats.reused_tokens == 0
    assert batch.final(second).stats.reused_tokens == 96, "six full blocks of the first prompt were found"


@pytest.mark.parametrize("size", [1, 2, 5, 8])
def test_every_batch_size_decodes_as_each_request_alone(size):
    batch = Collector(LocalBatch(engine(), max_running=8))
    params = GenerationParams(max_tokens=16)
    prompts = [prompt(20 + s, 7 + 31 * s) for s in range(size)]
    handles = [batch.submit(Request(tuple(p), params))[0] for p in prompts]
    batch.run()
    assert batch.batch.runner.tally.largest_batch == size
    for handle, p in zip(handles, prompts):
        assert batch.tokens(handle) == alone(p, params)


def part_read(batch: Collector, handle, length: int) -> bool:
    """Whether ``handle``'s prompt of ``length`` tokens is read in part (some chunks, not all)."""
    read = batch.batch.runner.tokens_read(handle.request_id)
    return read is not None and 0 < read < length


def test_a_prompt_cancelled_part_way_through_its_chunks_leaves_nothing_behind():
    """Its blocks go back after the next step, and only the chunks read are a cached prefix: the same
    prompt asked again reads the rest and answers as it would alone."""
    made = engine()
    batch = Collector(LocalBatch(made, step_tokens=CHUNKED))
    params, long = GenerationParams(max_tokens=30), prompt(40, 300)
    running = batch.submit(Request(tuple(prompt(41, 20)), GenerationParams(max_tokens=400)))[0]
    batch.step(3)
    joining = batch.submit(Request(tuple(long), params))[0]
    while not part_read(batch, joining, len(long)):
        batch.step(1)
    read = batch.batch.runner.tokens_read(joining.request_id)  # what the chunks so far have read
    pool = made.pool("target")
    assert pool.manager.cached_prefix(long)[0] == read // 16 * 16, "the chunks read are found by prefix hits"
    joining.cancel()
    batch.step(1)
    assert pool.stats().used_blocks == len(pool.manager.block_ids(
        batch.batch.runner.sequences[running.request_id].caches.target.seq_id))
    assert pool.manager.cached_prefix(long)[0] >= read // 16 * 16, "what was read stays cached"
    again = batch.submit(Request(tuple(long), params))[0]
    while len(batch.tokens(again)) < 30:
        batch.step(1)
    assert batch.tokens(again) == alone(long, params)
    running.cancel()
    batch.run()


def test_a_short_prompt_sharing_the_start_of_a_long_one_being_read():
    """A short prompt that starts like a long one read in part takes the blocks read so far, never those of
    a chunk announced in the same step (no layer holds it yet): both answer as alone."""
    batch = Collector(LocalBatch(engine(), step_tokens=CHUNKED))
    params, long = GenerationParams(max_tokens=20), prompt(42, 200)
    running = batch.submit(Request(tuple(prompt(43, 20)), GenerationParams(max_tokens=300)))[0]
    batch.step(3)
    first = batch.submit(Request(tuple(long), params))[0]
    while not part_read(batch, first, len(long)):
        batch.step(1)
    second = batch.submit(Request(tuple(long[:50]), params))[0]
    while len(batch.tokens(first)) < 20 or len(batch.tokens(second)) < 20:
        batch.step(1)
    assert batch.tokens(first) == alone(long, params)
    assert batch.tokens(second) == alone(long[:50], params)
    running.cancel()
    batch.run()


def test_a_chats_new_message_after_its_cached_history_is_read_in_one_step():
    """The history's blocks are found cached, so what is left to read is short: it goes through every layer
    in one step, beside a running stream, and the reply equals the same request alone."""
    batch = Collector(LocalBatch(engine()))
    history, params = prompt(50, 300), GenerationParams(max_tokens=6)
    first = batch.submit(Request(tuple(history), params))[0]
    batch.run()
    running = batch.submit(Request(tuple(prompt(51, 20)), GenerationParams(max_tokens=300)))[0]
    batch.step(4)
    follow = history + batch.tokens(first) + prompt(52, 20)
    handle = batch.submit(Request(tuple(follow), params))[0]
    steps = 0
    while not batch.tokens(handle):
        batch.step(1)
        steps += 1
    assert steps <= 3, f"its first token came {steps} steps after it was asked"
    while len(batch.tokens(handle)) < 6:
        batch.step(1)
    assert batch.tokens(handle) == alone(follow, params)
    running.cancel()
    batch.run()


def test_rows_sampling_with_their_own_temperature_p_and_seed_draw_in_one_graph_as_each_alone(monkeypatch):
    """Qwen3's masks (top-k 20, top-p) on every row, each with its own temperature, p and seed: the batch
    samples in one graph a step (no reply's own sampler runs), and every reply is the one it gets alone."""
    rows = [GenerationParams(max_tokens=16, temperature=t, top_k=20, top_p=p, seed=s)
            for t, p, s in ((0.6, 0.95, 1), (1.1, 0.8, 2), (0.9, 0.99, 3))]
    prompts = [prompt(50 + i, 30 + 11 * i) for i in range(3)]
    expected = [alone(p, params) for p, params in zip(prompts, rows)]
    batch = Collector(LocalBatch(engine()))
    handles = [batch.submit(Request(tuple(p), params))[0] for p, params in zip(prompts, rows)]
    while not all(batch.tokens(h) for h in handles):  # every prompt read: the rest decodes as one batch
        batch.step()

    def alone_sampler(*args):
        raise AssertionError("a reply's own sampler ran in a batch whose rows share one graph")
    monkeypatch.setattr(TokenPicker, "__call__", alone_sampler)
    batch.run()
    assert [batch.tokens(h) for h in handles] == expected
    assert batch.batch.runner.tally.largest_batch == 3


def test_a_batch_of_mixed_sampling_picks_once_a_kind_and_each_reply_as_alone(monkeypatch):
    """Two greedy rows, two with Qwen3's masks, one with top-p alone (another graph), one with a repetition
    penalty: each reply is the one it gets alone; only the penalised reply runs its own sampler, and a step
    makes one pick for each kind of row (four here), not one a row."""
    rows = [GenerationParams(max_tokens=12, temperature=0.0), GenerationParams(max_tokens=12, temperature=0.0),
            GenerationParams(max_tokens=12, temperature=0.6, top_k=20, top_p=0.95, seed=1),
            GenerationParams(max_tokens=12, temperature=1.1, top_k=20, top_p=0.8, seed=2),
            GenerationParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=3),
            GenerationParams(max_tokens=12, temperature=0.7, seed=4, repetition_penalty=1.3)]
    prompts = [prompt(70 + i, 28 + 5 * i) for i in range(len(rows))]
    expected = [alone(p, params) for p, params in zip(prompts, rows)]
    batch = Collector(LocalBatch(engine()))
    handles = [batch.submit(Request(tuple(p), params))[0] for p, params in zip(prompts, rows)]
    while not all(batch.tokens(h) for h in handles):  # every prompt read: the rest decodes as one batch
        batch.step()
    own, picks = [], []
    real_own, real_rows = TokenPicker.__call__, decode_steps._pick_rows
    monkeypatch.setattr(TokenPicker, "__call__", lambda picker, logits: own.append(picker.params.repetition_penalty)
                        or real_own(picker, logits))
    monkeypatch.setattr(decode_steps, "_pick_rows", lambda seqs, logits: picks.append(len(seqs))
                        or real_rows(seqs, logits))
    batch.step()
    assert sorted(picks) == [1, 1, 2, 2], "a step picks once for each kind of row"
    assert own == [1.3]
    batch.run()
    assert [batch.tokens(h) for h in handles] == expected
    assert batch.batch.runner.tally.largest_batch == len(rows)


PROMPT_JUMP = 100.0  # what the clocks below add while a pass carries a prompt's rows


def jumping_clock(monkeypatch, target: list[object] | None = None) -> list[float]:
    """A decision clock that ticks a millisecond a reading and jumps ``PROMPT_JUMP`` while a pass carries a
    prompt's chunk (when ``target`` holds a decoder: only that decoder's passes)."""
    from mlxcore import decision_clock
    from mlxcore.batching.batch_forward import BatchDecoder

    clock = [0.0]

    def now() -> float:
        clock[0] += 0.001
        return clock[0]

    forward = BatchDecoder.__call__

    def timed(self, caches, inputs, feeds=(), keep=()):
        if any(not feed.short for feed in feeds) and (not target or self is target[0]):  # a prompt's chunk rides
            clock[0] += PROMPT_JUMP
        return forward(self, caches, inputs, feeds, keep)

    monkeypatch.setattr(decision_clock, "now", now)
    monkeypatch.setattr(BatchDecoder, "__call__", timed)
    return clock


def one_joins_in_chunks(batch: Collector) -> None:
    """A reply decodes; a second joins, its 200-token prompt read in chunks beside the first's steps."""
    params = GenerationParams(max_tokens=40)
    first = batch.submit(Request(tuple(prompt(1, 20)), params))[0]
    batch.step(8)
    second = batch.submit(Request(tuple(prompt(2, 200)), params))[0]
    batch.run()
    assert len(batch.tokens(first)) == len(batch.tokens(second)) == 40


def test_a_step_carrying_prompt_rows_is_not_timed_as_a_plain_step(monkeypatch):
    """The draft-length controller compares rounds with plain steps: a reply decoding beside another's prompt
    being read must not learn that plain steps are slow (it would then draft at a loss). The clock jumps while a
    pass carries prompt rows; no plain step's time may include a jump."""
    from mlxcore.draft_length import DraftLengthController

    jumping_clock(monkeypatch)
    samples: list[float] = []
    observe = DraftLengthController.observe_plain
    monkeypatch.setattr(DraftLengthController, "choose", lambda self: 0)  # plain steps only: each one timed
    monkeypatch.setattr(DraftLengthController, "observe_plain",
                        lambda self, seconds: (samples.append(seconds), observe(self, seconds)))
    one_joins_in_chunks(Collector(LocalBatch(engine(draft=True), step_tokens=CHUNKED)))
    assert len(samples) > 20, "plain steps were timed"
    assert max(samples) < 1.0, "a step that read prompt rows was timed as a plain step"


def test_a_round_is_timed_as_a_plain_step_is(monkeypatch):
    """A round's time runs, as a plain step's does, from the last step's end to its tokens emitted (emitting a
    round's several tokens a reply is part of what it costs), and a round whose pass read a prompt's rows is not
    timed (it would learn that drafting is dear). (The clock jumps for the target's prompt rows only: the draft's
    reading of a joining reply's prompt is a cost of the round.)"""
    from mlxcore.batching.runner import BatchRunner
    from mlxcore.draft_length import DraftLengthController

    target: list[object] = []
    clock = jumping_clock(monkeypatch, target)
    emitting = 10.0  # the clock's jump while a round emits its tokens
    emit = BatchRunner._emit_round

    def slow_emit(self, seq, tokens):
        clock[0] += emitting
        return emit(self, seq, tokens)

    samples: list[float | None] = []
    observe = DraftLengthController.observe_round
    monkeypatch.setattr(BatchRunner, "_emit_round", slow_emit)
    monkeypatch.setattr(DraftLengthController, "choose", lambda self: 2)  # a round every step
    monkeypatch.setattr(DraftLengthController, "observe_round",
                        lambda self, k, accepted, seconds, *args, **kwargs:
                        (samples.append(seconds), observe(self, k, accepted, seconds, *args, **kwargs)))
    batch = LocalBatch(engine(draft=True), step_tokens=CHUNKED)
    target.append(batch.runner.decoder)
    one_joins_in_chunks(Collector(batch))
    assert clock[0] > 2 * PROMPT_JUMP, "the target's passes read the prompt in chunks"
    timed = [seconds for seconds in samples if seconds is not None]
    assert len(timed) > 20 and len(timed) < len(samples), "rounds were timed, and those beside a prompt were not"
    assert min(timed) >= emitting, "a round's time includes emitting its tokens"
    assert max(timed) < PROMPT_JUMP, "a round whose pass (or the pass before) read prompt rows was timed"

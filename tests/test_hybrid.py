"""Hybrid-attention models (Qwen3.5): Gated DeltaNet linear layers beside full attention, on one sequence.

A tiny random-weight Qwen3.5 (mlx-lm's own model code, float32, the embedded tokenizer) must give mlx-lm's
``stream_generate`` tokens, greedy, through our loop and caches: from an empty cache, and carrying its linear
layers' state into a next turn that extends what the cache holds; in ChatSession and in the chat window
(its engine in its own process). What it does not run on yet is refused before any reply, in one line
(docs/hybrid.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from assets import MODELS_DIR
from mlxcore import Engine, GenerationParams, render_chat, KVConfig, ModelChoice, TokenEvent, UsageError, open_engine
from sessions import ChatSession, SessionStore
from sessions.errors import SessionFileError
from sessions.file_read import read_contents
from bench.twins import twin_folder
from tiny_models import (tiny_hybrid, tiny_hybrid_config, tiny_hybrid_moe_config, tiny_qwen3_next,
                         tiny_qwen3_next_config, write_model_folder)
from twin_fixtures import twins_root  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
GREEDY = GenerationParams(temperature=0.0, max_tokens=40, ignore_eos=True)
KINDS = {"standard": KVConfig(kind="standard"), "rotating": KVConfig(kind="rotating", max_kv=4096)}


FAMILIES = {"qwen3_5": (tiny_hybrid, tiny_hybrid_config), "qwen3_next": (tiny_qwen3_next, tiny_qwen3_next_config)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def folder(request, tmp_path_factory) -> Path:
    """A tiny Qwen3.5, then a tiny Qwen3-Next (their own mlx-lm modules: Qwen3-Next's attention, Gated DeltaNet
    and experts): the tests that take it run on both."""
    model, config = FAMILIES[request.param]
    return write_model_folder(model(), tmp_path_factory.mktemp(request.param) / f"tiny-{request.param}",
                              MODELS_DIR / "mini-target", config=config())


@pytest.fixture(scope="module")
def qwen35_folder(tmp_path_factory) -> Path:
    """The tiny Qwen3.5 alone, for the tests that start processes (the command, serve, the window)."""
    return write_model_folder(tiny_hybrid(), tmp_path_factory.mktemp("hybrid") / "tiny-hybrid",
                              MODELS_DIR / "mini-target", config=tiny_hybrid_config())


@pytest.fixture(scope="module")
def reference(folder):
    """mlx-lm's greedy tokens after a prompt, from its own model and cache."""
    model, tokenizer = load(str(folder))

    def tokens(prompt: list[int], count: int = 40) -> list[int]:
        return [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=count,
                                                 sampler=make_sampler(0.0))]
    return tokenizer, tokens


def generated(engine, prompt: list[int], caches, params: GenerationParams = GREEDY) -> list[int]:
    return [e.token for e in engine.generate(prompt, caches, params) if isinstance(e, TokenEvent)]


def test_the_moe_variant_gives_mlx_lms_tokens(tmp_path):
    """Qwen3.5-MoE: the same layers with a sparse expert block (mlx-lm's, as for Qwen3-MoE)."""
    moe = write_model_folder(tiny_hybrid(config=tiny_hybrid_moe_config()), tmp_path / "tiny-hybrid-moe",
                             MODELS_DIR / "mini-target", config=tiny_hybrid_moe_config())
    model, tokenizer = load(str(moe))
    prompt = tokenizer.encode("Once upon a time")
    expected = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=24, sampler=make_sampler(0.0))]
    engine = open_engine(str(moe), kv=KINDS["standard"]).engine
    assert generated(engine, prompt, engine.new_caches(), GREEDY.replaced({"max_tokens": 24})) == expected


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_greedy_tokens_are_mlx_lms(folder, reference, kind):
    tokenizer, tokens = reference
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 + 7?"}], add_generation_prompt=True)
    engine = open_engine(str(folder), kv=KINDS[kind]).engine
    caches = engine.new_caches()
    assert generated(engine, prompt, caches) == tokens(prompt)
    # three linear layers' states and one attention layer's keys and values, for the prompt and the reply
    assert caches.target.kind == "hybrid" and caches.target.offset == len(prompt) + 40
    assert len(caches.target.states) == 3 and caches.target.geometry.num_layers == 1


def test_a_next_turn_carries_the_linear_state(folder, reference):
    """The second prompt extends what the cache holds: only the new tokens are read, and the reply is the one
    mlx-lm gives reading the whole second prompt from nothing."""
    tokenizer, tokens = reference
    engine = open_engine(str(folder), kv=KINDS["standard"]).engine
    caches = engine.new_caches()
    first = tokenizer.encode("Once upon a time")
    reply = generated(engine, first, caches, GenerationParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    second, held = first + reply + tokenizer.encode(" and then"), caches.target.offset
    events = list(engine.generate(second, caches, GREEDY))
    assert [e.token for e in events if isinstance(e, TokenEvent)] == tokens(second)
    assert events[-1].stats.reused_tokens == held == len(first) + len(reply)


def test_a_prompt_that_does_not_extend_the_cache_is_read_again(folder, reference):
    """The linear state cannot be trimmed: an edit before any snapshot starts from an empty cache, with the
    right reply."""
    tokenizer, tokens = reference
    engine = open_engine(str(folder), kv=KINDS["standard"]).engine
    caches = engine.new_caches()
    generated(engine, tokenizer.encode("Once upon a time there was"), caches)
    other = tokenizer.encode("Once upon a hill")
    events = list(engine.generate(other, caches, GREEDY))
    assert [e.token for e in events if isinstance(e, TokenEvent)] == tokens(other)
    assert events[-1].stats.reused_tokens == 0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_history_that_drops_the_reply_goes_back_to_the_prompts_end(folder, reference, kind):
    """As when the template drops a reply's thinking from the history: the next prompt leaves the cache right
    after the last prompt, where a snapshot is. Only the rest is read, and the reply is mlx-lm's to the whole
    prompt read from nothing."""
    tokenizer, tokens = reference
    engine = open_engine(str(folder), kv=KINDS[kind]).engine
    caches = engine.new_caches()
    first = tokenizer.encode("Once upon a time there was a lighthouse keeper who")
    generated(engine, first, caches, GenerationParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    second = first + tokenizer.encode(" kept a cat. Then")  # not the reply the cache holds
    events = list(engine.generate(second, caches, GREEDY))
    assert [e.token for e in events if isinstance(e, TokenEvent)] == tokens(second)
    # the snapshot is where the prompt's last token was fed, as the first decode step (the loop reads a prompt
    # but its last token, which goes in with the decode rows)
    assert events[-1].stats.reused_tokens == len(first) - 1
    again = list(engine.generate(second, caches, GREEDY))  # a regenerate: back to this prompt's snapshot
    assert [e.token for e in again if isinstance(e, TokenEvent)] == tokens(second)
    assert again[-1].stats.reused_tokens == len(second) - 1


def test_a_fork_answers_as_its_source(folder):
    engine = open_engine(str(folder), kv=KINDS["standard"]).engine
    caches = engine.new_caches()
    prompt = list(range(100, 130))
    generated(engine, prompt, caches, GenerationParams(temperature=0.0, max_tokens=1))
    forked = caches.fork()
    follow = prompt + [7, 8, 9]
    assert generated(engine, follow, forked) == generated(engine, follow, caches)


@pytest.mark.parametrize("where", ["file", "store"])
def test_a_saved_chat_reopens_with_its_states_and_goes_on_as_the_live_one(folder, tmp_path, where):
    """ChatSession over a hybrid model: a session file (or the store) keeps the linear states beside the KV,
    with its snapshots. Reopened, the next turn reads only what the live session reads (it starts where the
    live one does: a random model's broken UTF-8 makes the history's text differ from the cached tokens, which
    sends both back to a snapshot), and answers as the live one does; so do a regenerate, an edit of the last
    message and a fork, each reusing a prefix."""
    engine = open_engine(str(folder), kv=KINDS["standard"]).engine
    live = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=8))
    assert all(live.send(text) for text in ("What is 12 + 7?", "And 3 + 4?"))
    store = SessionStore(tmp_path / "store")
    if where == "file":
        live.save(tmp_path / "chat.mlxchat")
        header = read_contents(tmp_path / "chat.mlxchat").header
        offsets = [offset for offset, _ in live.caches.target.snapshots] + [live.caches.target.offset]
        assert header["version"] == 4 and header["cache"]["target"]["linear"]["offsets"] == offsets
        reopened = ChatSession.load(tmp_path / "chat.mlxchat", engine)
    else:
        reopened = store.load(store.save(live).id, engine)
    assert reopened.messages == live.messages and reopened.restore_note is None
    assert reopened.caches.tokens == live.caches.tokens
    assert_goes_on_as_the_live_one(live, reopened)
    if where == "file":  # a later save appends what is new (the snapshots' blocks kept), and reopens as well
        size = (tmp_path / "chat.mlxchat").stat().st_size
        reopened.save(tmp_path / "chat.mlxchat")
        grew = (tmp_path / "chat.mlxchat").stat().st_size - size
        assert 0 < grew < size
        again = ChatSession.load(tmp_path / "chat.mlxchat", engine)
        assert again.send("And 5 + 5?") == live.send("And 5 + 5?")
        assert again.last_stats.reused_tokens == live.last_stats.reused_tokens > 0
    store.close()


def assert_goes_on_as_the_live_one(live: ChatSession, reopened: ChatSession) -> None:
    """A next turn, a regenerate, an edit of the last message and a fork: each the live chat's, reading the same
    tokens (reused and prefilled), reusing a prefix."""
    def forked(session):
        child = session.fork()
        return child.send("Name a fruit."), child.last_stats

    turns = {"next turn": lambda s: (s.send("Name a colour."), s.last_stats),
             "regenerate": lambda s: (s.regenerate(), s.last_stats),
             "edit": lambda s: (s.edit_last_user("Name a number."), s.last_stats), "fork": forked}
    for name, turn in turns.items():
        (said, stats), (heard, reopened_stats) = turn(live), turn(reopened)
        assert said == heard and reopened.messages == live.messages, name
        assert (stats.reused_tokens, stats.prefill_tokens) == (reopened_stats.reused_tokens,
                                                               reopened_stats.prefill_tokens), name
        assert reopened_stats.reused_tokens > 0, name


def test_a_save_cut_short_opens_at_the_save_before_with_its_states(folder, tmp_path):
    """A crash in the middle of a save (the file cut inside its new blocks): the file opens at its last
    complete save, states included, and goes on as that save's chat does."""
    engine = open_engine(str(folder), kv=KINDS["standard"]).engine
    path = tmp_path / "chat.mlxchat"
    live = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=8))
    live.send("What is 12 + 7?")
    live.save(path)
    first = path.stat().st_size
    saved = ChatSession.load(path, engine)
    live.send("And 3 + 4?")
    live.save(path)
    with open(path, "r+b") as file:
        file.truncate(first + (path.stat().st_size - first) // 2)
    reopened = ChatSession.load(path, engine)
    assert "did not finish" in reopened.restore_note and reopened.messages == saved.messages
    assert reopened.caches.tokens == saved.caches.tokens
    assert reopened.send("Name a colour.") == saved.send("Name a colour.")
    assert reopened.last_stats.reused_tokens == saved.last_stats.reused_tokens > 0


@pytest.mark.parametrize("change, said", [
    (lambda h: h.update(version=3), "holds no linear states"),
    (lambda h: h["cache"]["target"]["linear"]["offsets"].pop(), "linear states and its tokens disagree"),
    (lambda h: h["cache"]["target"]["linear"]["offsets"].insert(0, 99), "do not increase"),
    (lambda h: h["cache"]["target"]["linear"]["shapes"].update({"0.2": ["F32", [1]]}), "no valid dtype and shape"),
])
def test_a_header_whose_linear_states_do_not_add_up_is_refused(folder, change, said):
    from sessions.file_header import read_saved_session
    from sessions.session_file import session_header

    engine = open_engine(str(folder), kv=KINDS["standard"]).engine
    session = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=4))
    session.send("What is 12 + 7?")
    header = json.loads(json.dumps(session_header(session, {"target": (
        session.caches.target.geometry, session.caches.target.state_dict(session.caches.ids)[1])}, 1.0)))
    assert read_saved_session(header, "chat").target.linear.offsets[-1] == session.caches.target.offset
    change(header)
    with pytest.raises(SessionFileError, match=said):
        read_saved_session(header, "chat")


def test_a_file_saved_before_linear_states_still_opens(folder, tmp_path, monkeypatch):
    """Session format 3 kept a hybrid chat's conversation only: it opens, and its next turn reads it again."""
    from sessions import session_file

    engine = open_engine(str(folder), kv=KINDS["standard"]).engine
    session = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=8))
    session.send("What is 12 + 7?")
    with monkeypatch.context() as m:  # what the writer of format 3 saved: no hybrid cache
        m.setattr(session_file, "saved_caches", lambda s: {})
        session.save(tmp_path / "old.mlxchat")
    assert read_contents(tmp_path / "old.mlxchat").header["version"] == 3
    reopened = ChatSession.load(tmp_path / "old.mlxchat", engine)
    assert reopened.messages == session.messages and reopened.caches.target.offset == 0
    assert reopened.send("And 3 + 4?") and reopened.last_stats.reused_tokens == 0


@pytest.mark.parametrize("thinking", [True, False])
def test_turn_ten_of_a_chat_reads_only_the_last_reply_and_the_new_message(folder, thinking):
    """A 10-turn chat whose replies think (scripted: the model's forward passes run, the picked tokens are fixed).
    With thinking on the template drops each reply's think block from the history, so every prompt leaves the
    cache inside the last turn, right after the snapshot at the last prompt's end: the next turn reads the last
    reply as the history has it, the new message, and the assistant's header. With thinking off the history
    extends what the cache holds."""
    from scripted_model import scripted_model

    engine = open_engine(str(folder), kv=KINDS["standard"]).engine
    chat = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=40), enable_thinking=thinking)
    tokenizer = engine.tokenizer
    script = [(f"question {n}.", (f"<think>\nStep {n}: the user asks question {n}.\n</think>\n\n" if thinking
                                 else "") + f"Answer {n}.") for n in range(1, 11)]
    with scripted_model(tokenizer, min(engine.eos_ids), script):
        for n in range(1, 11):
            assert chat.send(f"This is question {n}.").content == f"Answer {n}."
    stats = chat.last_stats
    prompt = render_chat(tokenizer, [m.as_dict() for m in chat.messages[:-1]], enable_thinking=thinking)
    assert len(prompt) == stats.prompt_tokens
    [turn_start] = tokenizer.encode("<|im_start|>", add_special_tokens=False)
    starts = [i for i, t in enumerate(prompt) if t == turn_start]
    # at most from the ninth reply's header on: "<|im_start|>assistant\nAnswer 9.<|im_end|>\n", the tenth
    # question, and the header the tenth reply follows (thinking on: from the snapshot at the ninth prompt's
    # end; off, mlxchat keeps the empty think blocks the cache holds, so the history extends the cache)
    assert stats.reused_tokens + stats.prefill_tokens == stats.prompt_tokens
    assert stats.prefill_tokens <= stats.prompt_tokens - starts[-3]
    print(f"turn 10, thinking {'on' if thinking else 'off'}: {stats.prefill_tokens} of {stats.prompt_tokens} "
          f"prompt tokens read ({stats.prefill_tokens / stats.prompt_tokens:.3f})")


@pytest.fixture(scope="module")
def hybrid_draft(tmp_path_factory) -> Path:
    """Another tiny Qwen3.5, a draft for the hybrid target (and for the embedded Qwen3 target)."""
    return write_model_folder(tiny_hybrid(seed=1), tmp_path_factory.mktemp("hybrid-draft") / "tiny-hybrid-draft",
                              MODELS_DIR / "mini-target", config=tiny_hybrid_config())


@pytest.mark.parametrize("pair", ["hybrid target, Qwen3 draft", "hybrid target and draft", "Qwen3 target, hybrid draft"])
@pytest.mark.parametrize("k", [1, 3, "scripted"])
def test_speculative_greedy_is_plain_greedy(folder, hybrid_draft, pair, k):
    """Rounds whose drafts are partly rejected rewind a hybrid cache to its mark and feed the kept tokens again:
    the tokens are plain greedy decoding's, round shape after round shape."""
    from test_speculative import controller

    target, draft = {"hybrid target, Qwen3 draft": (str(folder), "mini-draft"),
                     "hybrid target and draft": (str(folder), str(hybrid_draft)),
                     "Qwen3 target, hybrid draft": ("mini-target", str(hybrid_draft))}[pair]
    prompt = list(range(300, 330))
    plain = open_engine(target, kv=KINDS["standard"]).engine
    expected = generated(plain, prompt, plain.new_caches())
    spec = open_engine(ModelChoice(model=target, draft=draft), kv=KINDS["standard"], num_draft=5).engine
    spec.draft_control = controller(k)
    caches = spec.new_caches()
    events = list(spec.generate(prompt, caches, GREEDY))
    stats = events[-1].stats
    assert [e.token for e in events if isinstance(e, TokenEvent)] == expected
    assert stats.draft_proposed > stats.draft_accepted  # some rounds were rewound
    assert caches.tokens == (prompt + expected)[:caches.target.offset]  # what it holds is what was said


def test_a_lone_round_is_timed_as_a_batchs_round_is(folder, monkeypatch):
    """A hybrid model's round (a lone reply's, ``SpeculativeDecoder.round``) is timed as a batch's round and a
    plain step are, from the last step's end to its tokens emitted: emitting a round's tokens is part of what
    it costs (a clock that jumps while a round emits)."""
    from mlxcore import decision_clock
    from mlxcore.batching.runner import BatchRunner
    from mlxcore.draft_length import DraftLengthController
    from test_speculative import controller

    clock, emitting = [0.0], 10.0

    def now() -> float:
        clock[0] += 0.001
        return clock[0]

    emit, observe, samples = BatchRunner._emit_round, DraftLengthController.observe_round, []

    def slow_emit(self, seq, tokens):
        clock[0] += emitting
        return emit(self, seq, tokens)

    monkeypatch.setattr(decision_clock, "now", now)
    monkeypatch.setattr(BatchRunner, "_emit_round", slow_emit)
    monkeypatch.setattr(DraftLengthController, "observe_round", lambda self, k, accepted, seconds, *args, **kwargs:
                        (samples.append(seconds), observe(self, k, accepted, seconds, *args, **kwargs)))
    spec = open_engine(ModelChoice(model=str(folder), draft="mini-draft"), kv=KINDS["standard"], num_draft=5).engine
    spec.draft_control = controller(2)
    list(spec.generate(list(range(300, 330)), spec.new_caches(), GREEDY))
    assert len(samples) > 5 and min(samples) >= emitting, samples


def test_what_a_hybrid_model_does_not_run_on_yet_is_refused(qwen35_folder):
    opened = open_engine(str(qwen35_folder))  # the default paged cache: the standard one instead, said in the note
    assert opened.engine.kv.kind == "standard" and "without prefix sharing" in opened.note
    with pytest.raises(UsageError, match=r'kind="standard" \(replies side by side\) or kind="rotating"'):
        Engine(opened.engine.model, opened.engine.tokenizer, kv=KVConfig(kind="paged"))
    with pytest.raises(UsageError, match=r'kind="standard" \(replies side by side\) or kind="rotating"'):
        open_engine(str(qwen35_folder), kv=KVConfig(kind="rotating", max_kv=512, kv_bits=8))


def test_the_command_answers_on_the_standard_cache_and_says_so(qwen35_folder):
    """``mlxchat ask`` on a hybrid model: the default paged cache becomes the standard one, with a note; what it
    cannot honour (8-bit keys and values) is one line, no traceback."""
    def ask(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "app.cli", "ask", "hi", "--model", str(qwen35_folder), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    answered = ask("--max-tokens", "5", "--json")
    final = json.loads(answered.stdout.strip().splitlines()[-1])
    assert answered.returncode == 0 and final["stats"]["generated_tokens"] == 5, answered.stderr
    assert "tiny-hybrid is a hybrid model (Qwen3.5): it answers on the standard KV cache, without prefix " \
           "sharing between chats, for now." in answered.stderr
    refused = ask("--kv-bits", "8")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "mlxchat: A hybrid model (Qwen3.5) runs on a float cache of --kv standard (replies side by side) or --kv "
        "rotating (one at a time), for now: the paged and 8-bit caches do not hold its linear layers' states yet."]


def test_serve_answers_requests_side_by_side(qwen35_folder, tmp_path):
    """A real ``mlxchat serve`` on a loopback port, the official openai client: two requests at once and a
    request for two choices, each the reply one process gives, streamed and not; the two choices decode in
    one pass a step (``/metrics``: more than one sequence a step on average)."""
    from concurrent.futures import ThreadPoolExecutor

    from serve_process import ServeProcess

    question = [{"role": "user", "content": "What is 12 + 7?"}]
    engine = open_engine(str(qwen35_folder), kv=KINDS["standard"]).engine
    session = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=10), enable_thinking=False)
    expected = session.send(question[0]["content"])
    with ServeProcess(tmp_path, pair=("--model", str(qwen35_folder))) as server:
        client = server.client()
        options = dict(model="tiny-hybrid", messages=question, temperature=0, max_tokens=10,
                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})

        def ask(stream: bool) -> str:
            if not stream:
                return client.chat.completions.create(**options).choices[0].message.content
            chunks = client.chat.completions.create(stream=True, **options)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(ask, [False, True]))
        choices = [c.message.content for c in client.chat.completions.create(n=2, **options).choices]
        assert server.metrics()["mlxchat_mean_batch_size"] > 1.0
    assert replies == [expected, expected] and choices == [expected, expected]


def test_the_chat_window_answers_on_a_hybrid_model(qwen35_folder):
    """The window with its engine in its own process, as ``mlxchat --model FOLDER --kv standard`` runs: two turns,
    each the reply ChatSession gives."""
    from app.engine_host.protocol import Open
    from test_tui_helpers import window_messages

    params = {"temperature": 0.0, "max_tokens": 12}
    questions = ("What is 12 + 7?", "And 3 + 4?")
    messages = window_messages(Open(model=str(qwen35_folder), no_draft=True, kv="standard", params=params), questions)
    session = ChatSession(open_engine(str(qwen35_folder), kv=KINDS["standard"]).engine,
                          params=GenerationParams(**params))
    for question in questions:
        session.send(question)
    assert list(messages) == [(m.role, m.content) for m in session.messages] and len(messages) == 4


@pytest.mark.parametrize("twin, bits", [("qwen3.5-9b", None), ("qwen3.5-0.8b", 4)])
def test_a_qwen35_geometry_twin_gives_mlx_lms_tokens(twins_root, twin, bits):
    """Twins of Qwen3.5-9B (float32) and -0.8B (4-bit, bf16 scales): the real layer pattern, linear heads and
    dims, partial rotary, Qwen3's 151,936-token vocabulary and tokenizer (Qwen3.5's are not in this tree)."""
    folder = twin_folder(twin, bits=bits, root=twins_root)
    model, tokenizer = load(str(folder))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 + 7?"}],
                                           add_generation_prompt=True)
    expected = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=8, sampler=make_sampler(0.0))]
    engine = open_engine(str(folder)).engine  # the default cache: the standard one for a hybrid model
    assert generated(engine, prompt, engine.new_caches(), GREEDY.replaced({"max_tokens": 8})) == expected
    assert engine.model.args.vocab_size == 151_936 and len(engine.new_caches().target.states) == 3 * len(
        engine.new_caches().target.attention.layers)


def test_the_twins_decode_speculatively_as_plainly(twins_root):
    """The 9B twin with the 0.8B twin as its draft: greedy with rewinds on both hybrid caches equals plain."""
    from test_speculative import controller

    target, draft = (str(twin_folder(name, bits=None, root=twins_root)) for name in ("qwen3.5-9b", "qwen3.5-0.8b"))
    prompt, params = list(range(1000, 1024)), GREEDY.replaced({"max_tokens": 16})
    plain = open_engine(target).engine
    spec = open_engine(ModelChoice(model=target, draft=draft), num_draft=4).engine
    spec.draft_control = controller("scripted")
    events = list(spec.generate(prompt, spec.new_caches(), params))
    assert [e.token for e in events if isinstance(e, TokenEvent)] == generated(plain, prompt, plain.new_caches(), params)
    assert events[-1].stats.draft_proposed > events[-1].stats.draft_accepted


def test_the_benchs_agreeing_draft_has_the_targets_logits():
    """``hybrid_spec_vs_plain``'s agreeing pair: the target's later layers silenced, its first layers the draft;
    greedy speculative decoding then accepts every draft and equals plain decoding."""
    import mlx.core as mx

    from bench.draft_lengths import FixedDraftLength
    from bench.hybrid_spec import agreeing_pair

    target, draft = agreeing_pair(tiny_hybrid(config=tiny_hybrid_config(layers=8)).language_model, layers=4)
    ids = mx.array([list(range(100, 140))])
    assert mx.array_equal(mx.argmax(target(ids), -1), mx.argmax(draft(ids), -1))
    tokenizer = open_engine(str(MODELS_DIR / "mini-target"), kv=KINDS["standard"]).engine.tokenizer
    plain = Engine(target, tokenizer, kv=KINDS["standard"])
    spec = Engine(target, tokenizer, kv=KINDS["standard"], draft_model=draft, num_draft=4)
    spec.draft_control = FixedDraftLength(4, max_k=4)  # every step a round (the adaptive length follows timings)
    prompt = list(range(100, 140))
    assert generated(spec, prompt, spec.new_caches()) == generated(plain, prompt, plain.new_caches())
    assert spec.last_stats.draft_proposed > 10 and spec.last_stats.acceptance == 1.0


def test_the_window_lets_a_hybrid_chat_answer_in_the_background(qwen35_folder, tmp_path, monkeypatch):
    """``--kv standard`` on a hybrid model: its engine batches (``Ready.batches``), so a chat answering goes on
    while the user opens another chat and asks there; both answer at once."""
    import asyncio

    from test_tui_background import ask_in_a_new_chat, record_generating
    from test_tui_helpers import SIZE, make_app, settle, wait_for, wait_ready

    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))

    async def scenario():
        app = make_app(max_tokens=400, ignore_eos=True, model=str(qwen35_folder), draft=None, no_draft=True,
                       kv="standard")
        seen = record_generating(app)
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            assert app.engine_batches
            app.prompt.load_text("Tell me a long story.")
            await pilot.press("enter")
            await ask_in_a_new_chat(pilot, app, "What is 12 + 7?", 12)
            await settle(pilot, app, 1)
            await wait_for(pilot, lambda: not app.answering, what="the first chat to finish")
            return seen

    seen = asyncio.run(scenario())
    assert any(len(event.session_ids) == 2 for event, _ in seen), "both chats were generating at once"

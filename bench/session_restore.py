"""Bench row ``restore_ttft_vs_cold``: first-token time of a restored session / of a cold re-prefill.

A conversation of ``min_tokens``+ tokens is saved into a session store, as the
window's autosave does. Restored: open it from a new store object on a fresh
engine (same models, empty block pools) and answer the next message; the time
covers reading the index and the blocks, and the first token. Cold: the same
history in a new session on a fresh engine, which must prefill all of it. Both
reply with one token, so the time is to the first token. Run as a module, it
measures the same in a new process:
``python -m bench.session_restore STORE CHAT TARGET [DRAFT] --kv KIND``.
``measure_restore`` does the same with a session file, and ``measure_appended_restore``
with a session file that grew by one appended save per turn (``appended_file`` in the row).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.prompts import QUESTIONS
from bench.timing import paired_median
from mlxcore.engine import Engine, KVConfig
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams
from sessions.chat_session import ChatSession
from sessions.messages import Message
from sessions.store import SessionStore

NEXT = "Thank you. One more question: what is 15 + 27?"
SYSTEM = "You are a helpful assistant. Answer briefly and exactly."


def restore_ttft_vs_cold(target_ref: str, draft_ref: str | None, runs: int, *, min_tokens: int = 2000,
                         kv: str = "paged", new_process: bool = True) -> dict:
    """The row for `mlxchat bench`: ``measure_restore`` on the named models (and in a new process)."""
    opened = open_engine(ModelChoice(model=target_ref, draft=draft_ref, no_draft=draft_ref is None),
                         KVConfig(kind=kv))
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "sessions"
        result = measure_store_restore(opened.engine, runs, root, min_tokens=min_tokens)
        if new_process:
            result["new_process"] = _in_new_process(root, result.pop("chat"), target_ref, draft_ref, kv)
        result["appended_file"] = measure_appended_restore(opened.engine, runs, Path(folder) / "chat.mlxchat",
                                                           min_tokens=min_tokens)
    return result


def measure_store_restore(engine: Engine, runs: int, root: Path, *, min_tokens: int = 2000) -> dict:
    """Build and save a long conversation into the store at ``root``; the median of restored / cold times."""
    session = long_session(engine, min_tokens)
    saver = SessionStore(root)
    chat = saver.save(session).id
    saver.close()
    result = _paired(engine, session, lambda: _restored_from_store(root, chat, twin(engine)), runs)
    return result | {"chat": chat, "store_bytes": sum(f.stat().st_size for f in root.rglob("*") if f.is_file())}


def measure_appended_restore(engine: Engine, runs: int, path: Path, *, min_tokens: int = 2000) -> dict:
    """``measure_restore`` on a file that grew by appends: the chat saved to ``path`` after every turn."""
    session = ChatSession(engine, SYSTEM, GenerationParams(max_tokens=24))
    turn = 0
    while session.caches.target.offset < min_tokens:
        session.send(long_message(turn))
        session.save(path)
        turn += 1
    return _paired(engine, session, lambda: _restored_seconds(path, twin(engine)), runs) | {
        "file_bytes": path.stat().st_size, "saves": turn}


def measure_restore(engine: Engine, runs: int, path: Path, *, min_tokens: int = 2000) -> dict:
    """Build and save a long conversation to the file ``path``; the median of restored / cold times."""
    session = long_session(engine, min_tokens)
    session.save(path)
    return _paired(engine, session, lambda: _restored_seconds(path, twin(engine)), runs) | {
        "file_bytes": path.stat().st_size}


def _paired(engine: Engine, session: ChatSession, restored, runs: int) -> dict:
    history, params = session.history, replace(session.params, max_tokens=1)
    cold = lambda: _cold_seconds(history, params, twin(engine))  # noqa: E731
    restored(), cold()  # warm up: allocation and first-call costs fall on no measured run
    r = paired_median(restored, cold, runs)
    return {"value": r["ratio"], "restored_seconds": r["ours"], "cold_seconds": r["theirs"],
            "tokens": session.caches.target.offset, "ratios": r["ratios"]}


def long_session(engine: Engine, min_tokens: int, reply_tokens: int = 24, *,
                 enable_thinking: bool = True) -> ChatSession:
    """A greedy conversation with long user messages whose cache holds at least ``min_tokens`` tokens."""
    session = ChatSession(engine, SYSTEM, GenerationParams(max_tokens=reply_tokens), enable_thinking=enable_thinking)
    turn = 0
    while session.caches.target.offset < min_tokens:
        session.send(long_message(turn))
        turn += 1
    return session


def twin(engine: Engine) -> Engine:
    """A new engine on the same models: its own (empty) block pools, nothing cached."""
    return Engine(engine.model, engine.tokenizer, kv=engine.kv, draft_model=engine.draft_model,
                  num_draft=engine.draft_control.max_k, context_length=engine.context_length,
                  fingerprint=engine.fingerprint, draft_fingerprint=engine.draft_fingerprint)


def _restored_seconds(path: Path, engine: Engine) -> float:
    start = time.perf_counter()
    session = ChatSession.load(path, engine)
    session.params = replace(session.params, max_tokens=1)
    session.send(NEXT)
    return time.perf_counter() - start


def _restored_from_store(root: Path, chat: str, engine: Engine) -> float:
    store = SessionStore(root)  # a new store object: its index is opened in the measured time
    try:
        start = time.perf_counter()
        session = store.load(chat, engine)
        session.params = replace(session.params, max_tokens=1)
        session.send(NEXT)
        return time.perf_counter() - start
    finally:
        store.close()


def _cold_seconds(history: list, params: GenerationParams, engine: Engine) -> float:
    start = time.perf_counter()
    session = ChatSession(engine, None, params)
    session.messages = list(history)
    session.send(NEXT)
    return time.perf_counter() - start


def long_message(turn: int) -> str:
    """About 500 tokens of notes ending in a question."""
    notes = " ".join(f"Note {turn}.{i}: the shop on street {i * 7 + turn} sold {i * 3 + 11} apples "
                     f"and {i + 4} pears on day {i + 1}." for i in range(24))
    return f"Here are my notes.\n{notes}\n{QUESTIONS[turn % len(QUESTIONS)]}"


def _in_new_process(root: Path, chat: str, target_ref: str, draft_ref: str | None, kv: str) -> dict:
    command = [sys.executable, "-m", "bench.session_restore", str(root), chat, target_ref,
               *([draft_ref] if draft_ref else []), "--kv", kv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if done.returncode:
        return {"value": None, "note": done.stderr.strip().splitlines()[-1:] or "failed"}
    return json.loads(done.stdout)


def _main() -> None:
    """In a new process: warm up on a short prompt, then time one restore and one cold prefill."""
    parser = argparse.ArgumentParser()
    parser.add_argument("store", type=Path)
    parser.add_argument("chat")
    parser.add_argument("target")
    parser.add_argument("draft", nargs="?")
    parser.add_argument("--kv", default="paged")
    args = parser.parse_args()
    engine = open_engine(ModelChoice(model=args.target, draft=args.draft, no_draft=args.draft is None),
                         KVConfig(kind=args.kv)).engine
    ChatSession(twin(engine), None, GenerationParams(max_tokens=1)).send("Hello")
    restored = _restored_from_store(args.store, args.chat, twin(engine))
    saved = SessionStore(args.store).read(args.chat)
    cold = _cold_seconds([*([Message("system", saved.system)] if saved.system else []), *saved.history],
                         replace(saved.params, max_tokens=1), twin(engine))
    print(json.dumps({"value": restored / cold, "restored_seconds": restored, "cold_seconds": cold}))


if __name__ == "__main__":
    _main()

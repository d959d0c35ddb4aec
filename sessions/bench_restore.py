"""Bench row ``restore_ttft_vs_cold``: first-token time of a restored session / of a cold re-prefill.

A conversation of ``min_tokens``+ tokens is saved. Restored: open the file on
a fresh engine (same models, empty block pools) and answer the next message;
the time covers reading the file and the first token. Cold: the same history
in a new session on a fresh engine, which must prefill all of it. Both reply
with one token, so the time is to the first token. Run as a module, it
measures the same in a new process:
``python -m sessions.bench_restore FILE TARGET [DRAFT] --kv KIND``.
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

from mlxcore.bench.prompts import QUESTIONS
from mlxcore.bench.timing import paired_median
from mlxcore.engine import Engine, KVConfig
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams
from sessions.chat_session import ChatSession
from sessions.session_file import load_session

NEXT = "Thank you. One more question: what is 15 + 27?"
SYSTEM = "You are a helpful assistant. Answer briefly and exactly."


def restore_ttft_vs_cold(target_ref: str, draft_ref: str | None, runs: int, *, min_tokens: int = 2000,
                         kv: str = "paged", new_process: bool = True) -> dict:
    """The row for `mlxchat bench`: ``measure_restore`` on the named models (and in a new process)."""
    opened = open_engine(ModelChoice(model=target_ref, draft=draft_ref, no_draft=draft_ref is None),
                         KVConfig(kind=kv))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.mlxchat"
        result = measure_restore(opened.engine, runs, path, min_tokens=min_tokens)
        if new_process:
            result["new_process"] = _in_new_process(path, target_ref, draft_ref, kv)
    return result


def measure_restore(engine: Engine, runs: int, path: Path, *, min_tokens: int = 2000) -> dict:
    """Build and save a long conversation to ``path``; the median of restored / cold first-token times."""
    session = long_session(engine, min_tokens)
    session.save(path)
    history, params = session.history, replace(session.params, max_tokens=1)
    restored = lambda: _restored_seconds(path, twin(engine))  # noqa: E731
    cold = lambda: _cold_seconds(history, params, twin(engine))  # noqa: E731
    restored(), cold()  # warm up: allocation and first-call costs fall on no measured run
    r = paired_median(restored, cold, runs)
    return {"value": r["ratio"], "restored_seconds": r["ours"], "cold_seconds": r["theirs"],
            "tokens": session.caches.target.offset, "file_bytes": path.stat().st_size, "ratios": r["ratios"]}


def long_session(engine: Engine, min_tokens: int, reply_tokens: int = 24) -> ChatSession:
    """A greedy conversation with long user messages whose cache holds at least ``min_tokens`` tokens."""
    session = ChatSession(engine, SYSTEM, GenerationParams(max_tokens=reply_tokens))
    turn = 0
    while session.caches.target.offset < min_tokens:
        session.send(_long_message(turn))
        turn += 1
    return session


def twin(engine: Engine) -> Engine:
    """A new engine on the same models: its own (empty) block pools, nothing cached."""
    return Engine(engine.model, engine.tokenizer, kv=engine.kv, draft_model=engine.draft_model,
                  num_draft=engine.draft_control.max_k, context_length=engine.context_length,
                  fingerprint=engine.fingerprint, draft_fingerprint=engine.draft_fingerprint)


def _restored_seconds(path: Path, engine: Engine) -> float:
    start = time.perf_counter()
    session = load_session(path, engine)
    session.params = replace(session.params, max_tokens=1)
    session.send(NEXT)
    return time.perf_counter() - start


def _cold_seconds(history: list, params: GenerationParams, engine: Engine) -> float:
    start = time.perf_counter()
    session = ChatSession(engine, None, params)
    session.messages = list(history)
    session.send(NEXT)
    return time.perf_counter() - start


def _long_message(turn: int) -> str:
    """About 500 tokens of notes ending in a question."""
    notes = " ".join(f"Note {turn}.{i}: the shop on street {i * 7 + turn} sold {i * 3 + 11} apples "
                     f"and {i + 4} pears on day {i + 1}." for i in range(24))
    return f"Here are my notes.\n{notes}\n{QUESTIONS[turn % len(QUESTIONS)]}"


def _in_new_process(path: Path, target_ref: str, draft_ref: str | None, kv: str) -> dict:
    command = [sys.executable, "-m", "sessions.bench_restore", str(path), target_ref,
               *([draft_ref] if draft_ref else []), "--kv", kv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if done.returncode:
        return {"value": None, "note": done.stderr.strip().splitlines()[-1:] or "failed"}
    return json.loads(done.stdout)


def _main() -> None:
    """In a new process: warm up on a short prompt, then time one restore and one cold prefill."""
    parser = argparse.ArgumentParser()
    parser.add_argument("file", type=Path)
    parser.add_argument("target")
    parser.add_argument("draft", nargs="?")
    parser.add_argument("--kv", default="paged")
    args = parser.parse_args()
    engine = open_engine(ModelChoice(model=args.target, draft=args.draft, no_draft=args.draft is None),
                         KVConfig(kind=args.kv)).engine
    ChatSession(twin(engine), None, GenerationParams(max_tokens=1)).send("Hello")
    restored = _restored_seconds(args.file, twin(engine))
    saved = load_session(args.file, twin(engine))
    cold = _cold_seconds(saved.history, replace(saved.params, max_tokens=1), twin(engine))
    print(json.dumps({"value": restored / cold, "restored_seconds": restored, "cold_seconds": cold}))


if __name__ == "__main__":
    _main()

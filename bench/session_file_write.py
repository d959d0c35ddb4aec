"""Bench row ``session_file_write_ratio``: what one more `ask --session` turn writes to a long chat's file.

A greedy chat of ``min_tokens``+ tokens (``bench_restore.long_session``) on the named pair is
saved to a session file. Then, ``runs`` times, that file is put back, and a real
``mlxchat ask --session FILE --max-tokens 48`` process answers one short question: the bytes
the OS counted as that process's writes (``getrusage`` of the child: Linux's ``write_bytes``
of ``/proc/<pid>/io``, which every fsync'd save has reached before it returns) over the KV
bytes of the turn's new tokens, target and draft: each cache's tokens after what it kept from
before the turn (the reply, and the last reply when Qwen3's template rewrote it). One warm-up
ask first (nothing compiled or created on the measured runs). The value is the median.

Also in the row: ``open_dead_vs_compact``, the seconds to open a file whose dead space is just
under the compaction threshold (3 edits of the last ~500-token message) / to open the same chat's
compact file (``sessions export``'s form), paired median of at least ``OPEN_PAIRS``; and both files' sizes.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.timing import paired_median
from mlxcore.engine import Engine, KVConfig
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.sequences import common_prefix_length
from bench.session_restore import long_message, long_session, twin
from sessions.file_read import read_contents
from sessions.chat_session import ChatSession
from sessions.session_file import export_compact

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ("Thank you. One more question: what is 15 + 27?", "And what is 6 times 7?",
             "Which of the shops sold the most pears?", "Say it again in one word.")
ROLES = ("target", "draft")
OPEN_PAIRS = 11  # opens take ~0.1 s: enough pairs that a busy host's outliers do not move the median


def session_file_write_ratio(target_ref: str, draft_ref: str | None, runs: int, *, min_tokens: int = 3000,
                             dead_space: bool = True) -> dict:
    """The row: see the module docstring."""
    if not hasattr(os, "wait4"):
        return {"value": None, "note": "counts a child's written bytes with wait4 (POSIX)"}
    engine = open_engine(ModelChoice(model=target_ref, draft=draft_ref, no_draft=draft_ref is None),
                         KVConfig(kind="paged")).engine
    with tempfile.TemporaryDirectory() as folder:
        base, path = Path(folder) / "base.mlxchat", Path(folder) / "chat.mlxchat"
        session = long_session(engine, min_tokens)
        session.save(base)
        session.caches.release()
        command = _ask(path, target_ref, draft_ref)
        shutil.copyfile(base, path)
        _written(command + ["Hello."])  # warm-up: caches, lock files
        figures: dict[str, list] = {"ratios": [], "written_bytes": [], "new_kv_bytes": [], "new_tokens": []}
        for run in range(runs):
            shutil.copyfile(base, path)
            written = _written(command + [f"{QUESTIONS[run % len(QUESTIONS)]} (question {run + 1})"])
            new_tokens, new_kv = _new_kv(engine, base, path)
            figures["written_bytes"].append(written)
            figures["new_kv_bytes"].append(new_kv)
            figures["new_tokens"].append(new_tokens)
            figures["ratios"].append(written / new_kv)
        result = {"value": statistics.median(figures["ratios"]), **figures,
                  "tokens": len(read_contents(base).header["cache"]["target"]["tokens"]),
                  "file_bytes": base.stat().st_size, "goal": "<= 2"}
        if dead_space:
            result["open_dead_vs_compact"] = open_dead_vs_compact(engine, Path(folder), runs, min_tokens=min_tokens)
    return result


def open_dead_vs_compact(engine: Engine, folder: Path, runs: int, *, min_tokens: int = 3000) -> dict:
    """Seconds to open a file with dead space just under ``COMPACT_AT`` / its compact copy (paired median)."""
    dead, compact = folder / "dead.mlxchat", folder / "compact.mlxchat"
    session = long_session(engine, min_tokens)
    session.save(dead)
    for edit in range(3):  # each leaves the last exchange's ~1,000 tokens dead: 44% of the file (a 4th compacts)
        session.edit_last_user(long_message(100 + edit))
        session.save(dead)
    session.caches.release()
    export_compact(dead, compact)
    opened = {}
    for name, path in (("dead", dead), ("compact", compact)):
        opened[name] = lambda p=path: _open_seconds(p, engine)
        opened[name]()  # warm-up
    r = paired_median(opened["dead"], opened["compact"], max(runs, OPEN_PAIRS))
    commit = read_contents(dead).commit
    return {"value": r["ratio"], "dead_seconds": r["ours"], "compact_seconds": r["theirs"], "ratios": r["ratios"],
            "dead_share": 1 - commit.live_bytes / commit.end, "dead_bytes": dead.stat().st_size,
            "compact_bytes": compact.stat().st_size, "goal": "<= 1.1"}


def _open_seconds(path: Path, engine: Engine) -> float:
    fresh = twin(engine)  # an empty pool: nothing shared with an earlier open
    start = time.perf_counter()
    session = ChatSession.load(path, fresh)
    seconds = time.perf_counter() - start
    session.caches.release()
    return seconds


def _ask(path: Path, target_ref: str, draft_ref: str | None) -> list[str]:
    models = ["--model", target_ref, *(["--draft", draft_ref] if draft_ref else ["--no-draft"])]
    # No KV disk tier: its blocks are not the file's save, and what it writes depends on what the folder
    # already holds (a block is written once), which made the figure depend on the runs before it.
    return [sys.executable, "-m", "app.cli", "ask", "--session", str(path), *models, "--max-tokens", "48",
            "--disk-kv", "0"]


def _written(command: list[str]) -> int:
    """Bytes the OS counted as written by the process running ``command`` (``ru_oublock`` is in 512-byte units)."""
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=dict(os.environ, HF_HUB_OFFLINE="1"))
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise RuntimeError(f"mlxchat ask failed: {stderr.decode(errors='replace').strip()}")
    return usage.ru_oublock * 512


def _new_kv(engine: Engine, before: Path, after: Path) -> tuple[int, int]:
    """(target tokens, KV bytes) of the turn: each cache's tokens after what it kept from ``before``."""
    old, new = (read_contents(p).header["cache"] for p in (before, after))
    tokens = total = 0
    for role in ROLES:
        if old.get(role) and new.get(role):
            count = len(new[role]["tokens"]) - common_prefix_length(old[role]["tokens"], new[role]["tokens"])
            total += count * engine.whole_geometry(role).token_bytes
            tokens = tokens or count
    return tokens, total


def _main() -> None:
    """``python -m bench.session_file_write TARGET [DRAFT] [--runs N] [--open-only]``: the row as JSON."""
    import argparse
    import json
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("draft", nargs="?")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--no-dead-space", action="store_true", help="leave out open_dead_vs_compact")
    parser.add_argument("--open-only", action="store_true", help="only open_dead_vs_compact")
    args = parser.parse_args()
    if args.open_only:
        engine = open_engine(ModelChoice(model=args.target, draft=args.draft, no_draft=args.draft is None),
                             KVConfig(kind="paged")).engine
        with tempfile.TemporaryDirectory() as folder:
            result = open_dead_vs_compact(engine, Path(folder), args.runs)
    else:
        result = session_file_write_ratio(args.target, args.draft, args.runs, dead_space=not args.no_dead_space)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    _main()

"""When an appending session file compacts: the dead share ``COMPACT_AT`` (sessions/file_save.py), measured.

Usage: .venv/bin/python bench/studies/session_compaction.py [--cycles 12] [--tokens 3000]

A greedy chat of TOKENS+ tokens on the embedded pair (its last message a ~1,000-token paste)
is saved to a file; then CYCLES times: an edit that replaces that paste with another (its
blocks and its reply's die) and a regeneration, each saved to the file. For each threshold, the
same chat from the same start: bytes the saves wrote (Linux /proc/self/io ``write_bytes``)
over the KV bytes the turns computed, how many saves compacted, and the largest file over
the bytes its state needs. Opening a file costs the same with or without dead space (the
``open_dead_vs_compact`` figure of the ``session_file_write_ratio`` row), so the choice
trades bytes written for disk space.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlxcore  # noqa: E402,F401  (optimized BLAS before mlx)
import sessions.file_save as file_save  # noqa: E402
from mlxcore.engine import KVConfig  # noqa: E402
from mlxcore.launch import ModelChoice, open_engine  # noqa: E402
from mlxcore.sequences import common_prefix_length  # noqa: E402
from bench.session_restore import long_message, long_session  # noqa: E402
from bench.session_store import written_bytes  # noqa: E402

THRESHOLDS = (0.25, 0.5, 0.75, 1.01)  # 1.01: never compact


def play(session, cycle: int, step: str) -> None:
    if step == "regenerate":
        session.regenerate()
    else:
        session.edit_last_user(long_message(200 + cycle))


def sweep(threshold: float, base, cycles: int, folder: Path) -> dict:
    file_save.COMPACT_AT = threshold
    path = folder / f"chat-{threshold}.mlxchat"
    session = base.fork()
    session.save(path)
    written = computed = compactions = 0
    largest = 1.0
    for cycle in range(cycles):
        for step in ("edit", "regenerate"):
            before = {r: session.caches.ids[:getattr(session.caches, r).offset] for r in ("target", "draft")}
            play(session, cycle, step)
            for role, tokens in before.items():
                cache = getattr(session.caches, role)
                held = session.caches.ids[:cache.offset]
                computed += (cache.offset - common_prefix_length(tokens, held)) * cache.geometry.token_bytes
            inode = path.stat().st_ino
            written += written_bytes(lambda: session.save(path))
            compactions += path.stat().st_ino != inode
            mark = session.saved_files[os.path.realpath(path)]
            largest = max(largest, mark.end / mark.live)
    session.caches.release()
    return {"written_over_computed": written / computed, "compactions": compactions, "largest_over_live": largest}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=3000)
    args = parser.parse_args()
    engine = open_engine(ModelChoice(model="mini-target", draft="mini-draft"), KVConfig(kind="paged")).engine
    base = long_session(engine, args.tokens)
    with tempfile.TemporaryDirectory() as folder:
        for threshold in THRESHOLDS:
            r = sweep(threshold, base, args.cycles, Path(folder))
            print(f"COMPACT_AT {threshold:<5} written/computed {r['written_over_computed']:.2f}  compactions "
                  f"{r['compactions']:>2}  largest file / live {r['largest_over_live']:.2f}", flush=True)


if __name__ == "__main__":
    main()

"""The two choices of the session store, measured: block payloads in files or SQLite blobs; the draft's cache
stored or rebuilt on load.

Usage: .venv/bin/python bench/studies/store_choices.py [--runs 3] [--tokens 3000]

Files vs blobs, on the embedded pair (paged KV): a chat of TOKENS+ tokens is saved, then
RUNS short turns, each autosaved. For each way of keeping the block payloads, in the same
run and on the same turns: bytes each autosave wrote (Linux /proc/self/io, SQLite's
checkpoint included, as in the ``autosave_write_ratio`` row), seconds to open the chat
again (index, blocks and tensors: ``SessionStore.load`` on a fresh engine), seconds to
delete it and collect its blocks, and the bytes left on disk after the delete. Blobs
are kept in a second SQLite database (WAL, 4 KiB pages, synchronous=FULL) written in one
transaction per save before the index commit, with the same interface as
``sessions.block_files.BlockFiles`` (below), so the rest of the store is unchanged.

Draft stored vs rebuilt: the time to the first token after opening the stored chat,
with the draft's cache restored from the store, and with it left empty so that the
turn prefills the draft over the whole conversation (as a store that does not keep
it would; the draft's blocks are not read), each against a cold re-prefill of both
models, alternating.

Measured on this project's Linux host (2 shared x86-64 cores, MLX on the CPU, ext4), embedded
pair, a 3,656-token chat, ``--runs 3``, medians (both choices in one run; seconds are noisy on
this host, compare within a line):

    files  autosave 438,272 B written, open 353 ms, delete+GC  297 ms, 217,184 B left after delete
    blobs  autosave 1,314,816 B written, open 553 ms, delete+GC 1,171 ms, 18,382,688 B left after delete
    draft stored : first token / cold re-prefill 0.023 (pairs 0.020, 0.047, 0.023)
    draft rebuilt: first token / cold re-prefill 0.310 (pairs 0.314, 0.310, 0.184)
    block bytes of the chat: target 11,259,596, draft 1,900,236 (14%)

So block payloads go in files (blobs wrote 3x the bytes per autosave, through the WAL and again
at the checkpoint, and a deleted chat's blobs stay in the database file until a VACUUM), and the
draft's cache is stored: prefilling it again on open costs 0.31 of a cold start, past the 0.2 of
``restore_ttft_vs_cold``, while its blocks add 14% to what the store writes (44% with the users'
pair: 112 KiB of bf16 KV per token for Qwen3-0.6B against 144 KiB for the 8B).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlxcore  # noqa: E402,F401  (loads OpenBLAS before MLX)

import sessions.block_files as block_files  # noqa: E402
import sessions.store_chat as store_chat  # noqa: E402
import sessions.store_gc as store_gc  # noqa: E402
from bench.timing import paired_median  # noqa: E402
from bench.session_restore import NEXT, _cold_seconds, long_session, twin  # noqa: E402
from bench.session_store import SHORT_TURNS, _engine, written_bytes  # noqa: E402
from sessions.block_files import BlockFileError  # noqa: E402
from sessions.store import SessionStore  # noqa: E402


class BlockBlobs:
    """Block payloads as blobs in ``<store>/blobs.sqlite``: ``BlockFiles``'s interface, one open connection."""

    _open: dict[Path, sqlite3.Connection] = {}  # one per store, as the index keeps its own

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / "blobs.sqlite"

    @property
    def db(self) -> sqlite3.Connection:
        if self.path not in self._open:
            db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            db.execute("PRAGMA synchronous=FULL")
            if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
                raise RuntimeError("no WAL")
            db.execute("CREATE TABLE IF NOT EXISTS blobs (key TEXT PRIMARY KEY, data BLOB NOT NULL)")
            self._open[self.path] = db
        return self._open[self.path]

    def has(self, key: str) -> bool:
        return self.db.execute("SELECT 1 FROM blobs WHERE key = ?", (key,)).fetchone() is not None

    def write_many(self, blocks: Mapping[str, bytes]) -> int:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany("INSERT OR IGNORE INTO blobs (key, data) VALUES (?, ?)", blocks.items())
        self.db.execute("COMMIT")
        return sum(map(len, blocks.values()))

    def read(self, key: str) -> bytes:
        row = self.db.execute("SELECT data FROM blobs WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise BlockFileError(f"The stored cache block {key} is missing.", key)
        return bytes(row[0])

    def remove(self, key: str) -> bool:
        return self.db.execute("DELETE FROM blobs WHERE key = ?", (key,)).rowcount > 0

    def keys(self) -> Iterator[str]:
        return iter([key for (key,) in self.db.execute("SELECT key FROM blobs")])

    def temporaries(self) -> Iterator[Path]:
        return iter(())

    def checkpoint(self) -> None:
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def use_blobs(on: bool) -> None:
    """Point the store's block storage at blobs (``on``) or files."""
    kind = BlockBlobs if on else block_files.BlockFiles
    store_chat.BlockFiles = store_gc.BlockFiles = kind


def payload_choice(engine, runs: int, tokens: int) -> dict:
    results = {"files": {"written": [], "open_s": [], "delete_s": []}, "blobs": {"written": [], "open_s": [],
                                                                                "delete_s": []}}
    session = long_session(engine, tokens)
    session.params = replace(session.params, max_tokens=48)
    with tempfile.TemporaryDirectory() as folder:
        stores = {name: SessionStore(Path(folder) / name) for name in results}
        for name, store in stores.items():
            use_blobs(name == "blobs")
            store.save(session)
            _checkpoint(store, name)
        for turn in range(runs):
            session.send(SHORT_TURNS[turn % len(SHORT_TURNS)])
            for name, store in stores.items():
                use_blobs(name == "blobs")
                results[name]["written"].append(written_bytes(lambda store=store, name=name: (store.save(session), _checkpoint(store, name))))
        for name, store in stores.items():
            use_blobs(name == "blobs")
            store.close()
            for _ in range(runs):
                start = time.perf_counter()
                opened = SessionStore(store.root).load(session.store_id, twin(engine))
                results[name]["open_s"].append(time.perf_counter() - start)
                opened.caches.target.release()
            start = time.perf_counter()
            store.delete(session.store_id)
            results[name]["delete_s"].append(time.perf_counter() - start)
            results[name]["left_bytes"] = sum(f.stat().st_size for f in store.root.rglob("*") if f.is_file())
    use_blobs(False)
    return {name: {key: statistics.median(v) if isinstance(v, list) else v for key, v in r.items()} | {
        "written_each": r["written"]} for name, r in results.items()}


def _checkpoint(store: SessionStore, name: str) -> None:
    store.checkpoint()
    if name == "blobs":
        BlockBlobs(store.root).checkpoint()


def draft_choice(engine, runs: int, tokens: int) -> dict:
    session = long_session(engine, tokens)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "sessions"
        saver = SessionStore(root)
        chat = saver.save(session).id
        saver.close()
        history, params = session.history, replace(session.params, max_tokens=1)
        cold = lambda: _cold_seconds(history, params, twin(engine))  # noqa: E731
        stored = paired_median(lambda: _first_token(root, chat, engine, keep_draft=True), cold, runs)
        rebuilt = paired_median(lambda: _first_token(root, chat, engine, keep_draft=False), cold, runs)
        blocks = {role: sum(block_files.BlockFiles(root).path(b.key).stat().st_size
                            for b in saver._index.read(chat).blocks[role]) for role in ("target", "draft")}
    return {"stored": stored, "rebuilt": rebuilt, "block_bytes": blocks, "tokens": session.caches.target.offset}


def _first_token(root: Path, chat: str, engine, *, keep_draft: bool) -> float:
    """Open the chat on a fresh engine (empty pools) and answer one token; without ``keep_draft`` the draft's
    cache is not read (a store that does not keep it), so the turn prefills the draft over everything."""
    store = SessionStore(root)
    store_chat.restore_plan = _plan if keep_draft else _plan_without_draft
    start = time.perf_counter()
    session = store.load(chat, twin(engine))
    session.params = replace(session.params, max_tokens=1)
    session.send(NEXT)
    seconds = time.perf_counter() - start
    store.close()
    store_chat.restore_plan = _plan
    return seconds


_plan = store_chat.restore_plan


def _plan_without_draft(*args, **kwargs) -> tuple[list[str], list[str]]:
    roles, notes = _plan(*args, **kwargs)
    return [role for role in roles if role != "draft"], notes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=3000)
    args = parser.parse_args()
    engine = _engine("mini-target", "mini-draft")
    payloads = payload_choice(engine, args.runs, args.tokens)
    for name, figures in payloads.items():
        print(f"{name:6} autosave bytes {figures['written']:>9,.0f} (each {figures['written_each']}), "
              f"open {figures['open_s'] * 1000:6.1f} ms, delete+GC {figures['delete_s'] * 1000:6.1f} ms, "
              f"left after delete {figures['left_bytes']:,} B")
    drafts = draft_choice(engine, args.runs, args.tokens)
    for name in ("stored", "rebuilt"):
        r = drafts[name]
        print(f"draft {name:7}: first token {r['ours']:.3f} s, cold {r['theirs']:.3f} s, ratio {r['ratio']:.3f} "
              f"(each {[round(x, 3) for x in r['ratios']]})")
    print(f"block bytes of the {drafts['tokens']}-token chat: {drafts['block_bytes']}")


if __name__ == "__main__":
    main()

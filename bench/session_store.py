"""Bench rows of the session store: ``autosave_write_ratio`` and ``store_list_seconds``.

``autosave_write_ratio``: a chat of 3,000+ tokens on the named pair is saved into a
store; then, ``runs`` times, one more short turn and its autosave. The bytes the
autosave wrote are counted by the OS: ``write_bytes`` of ``/proc/self/io`` (Linux),
which counts what this process sent to the block layer. Every write a save makes is
followed by an fsync (block files, and SQLite's WAL at each commit), so its bytes are
sent, and counted, before the save returns; the WAL's pages are written once more
into the database at a checkpoint, which the row runs inside the measured window
(SQLite runs one by itself every ~1,000 pages) so the turn that caused them pays for
them. Not counted: the filesystem journal's own metadata (inodes, directory entries),
which ext4 writes from a kernel thread. The value is the median of written bytes /
KV bytes of the turn's new tokens in the caches the store keeps (target and draft):
the tokens after the point where the turn's prompt left the cache, which include the
last reply when the template rewrote it (``new_tokens``; ``cache_grew_by`` is the
plain growth). ``think_off``: the same with thinking off, where replies keep their
(empty) think block and the cache only grows.
For comparison, the same turn saved the old way (the whole chat rewritten as one file).

``store_list_seconds``: 50 chats of 3,000 tokens (target and draft caches of the
named pair, filled with random values: listing reads no cache), then the median time
of ``SessionStore(root).list()`` on a new store object (opening the index included).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxcore.engine import Engine, KVConfig
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams
from mlxcore.sequences import common_prefix_length
from bench.session_restore import SYSTEM, long_message, long_session
from sessions.chat_session import ChatSession
from sessions.messages import Message
from sessions.store import SessionStore

SHORT_TURNS = ("Thank you. One more question: what is 15 + 27?", "And what is 6 times 7?",
               "Which of the shops sold the most pears?", "Say it again in one word.")
ROLES = ("target", "draft")


def autosave_write_ratio(target_ref: str, draft_ref: str | None, runs: int, *, min_tokens: int = 3000) -> dict:
    """The row: see the module docstring."""
    if not Path("/proc/self/io").is_file():
        return {"value": None, "note": "counts bytes with Linux's /proc/self/io"}
    engine = _engine(target_ref, draft_ref)
    result = _autosaves(engine, runs, min_tokens, enable_thinking=True)
    return result | {"think_off": _autosaves(engine, runs, min_tokens, enable_thinking=False)}


def _autosaves(engine: Engine, runs: int, min_tokens: int, *, enable_thinking: bool) -> dict:
    """Short turns after one long chat, each autosaved: what each save wrote, against its new KV.

    Every run starts from the same chat: a fork of it, saved as a chat of its own (all
    its blocks shared: not measured), then one short turn and the measured autosave, then
    the fork is deleted, its own blocks with it, so that no run finds another's blocks.
    """
    with tempfile.TemporaryDirectory() as folder:
        store = SessionStore(Path(folder) / "sessions")
        base = long_session(engine, min_tokens, enable_thinking=enable_thinking)
        store.save(base)
        figures: dict[str, list] = {"ratios": [], "written_bytes": [], "new_kv_bytes": [], "new_tokens": [],
                                    "cache_grew_by": []}
        for turn in range(runs):
            session = base.fork()
            session.params = replace(session.params, max_tokens=48)
            store.save(session)
            store.checkpoint()  # the pages of that save are not the turn's
            _one_turn(store, session, f"{SHORT_TURNS[turn % len(SHORT_TURNS)]} (question {turn + 1})", figures)
            if turn == runs - 1:  # the old autosave, for comparison: the whole chat rewritten as one file
                whole = _file_rewrite(session, Path(folder) / "chat.mlxchat")
            store.delete(session.store_id)
            session.caches.release()
        store.close()
    return {"value": statistics.median(figures["ratios"]), **figures, "tokens": base.caches.target.offset,
            "whole_file_ratio": whole / figures["new_kv_bytes"][-1], "whole_file_bytes": whole}


def _one_turn(store: SessionStore, session: ChatSession, text: str, figures: dict[str, list]) -> None:
    before = _tokens(session)
    session.send(text)
    after = session.caches.tokens
    figures["new_kv_bytes"].append(_new_kv_bytes(session, before))
    figures["new_tokens"].append(len(after) - common_prefix_length(before["target"], after))
    figures["cache_grew_by"].append(len(after) - len(before["target"]))
    figures["written_bytes"].append(written_bytes(lambda: _save_and_checkpoint(store, session)))
    figures["ratios"].append(figures["written_bytes"][-1] / figures["new_kv_bytes"][-1])


def store_list_seconds(target_ref: str, draft_ref: str | None, runs: int, *, chats: int = 50,
                       tokens: int = 3000) -> dict:
    """The row: see the module docstring."""
    engine = _engine(target_ref, draft_ref)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "sessions"
        saver = SessionStore(root)
        for n in range(chats):
            session = _random_chat(engine, n, tokens)
            saver.save(session)
            saver.release(session.store_id)
            for role in ROLES:
                if getattr(session.caches, role) is not None:
                    getattr(session.caches, role).release()
        saver.close()
        seconds = []
        for _ in range(max(runs, 3)):
            store = SessionStore(root)
            start = time.perf_counter()
            listed = store.list()
            seconds.append(time.perf_counter() - start)
            store.close()
        disk = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert len(listed) == chats
    return {"value": statistics.median(seconds), "seconds": seconds, "chats": chats, "tokens": tokens,
            "store_bytes": disk}


def written_bytes(action: Callable[[], object]) -> int:
    """Bytes this process sent to the block layer while ``action`` ran (Linux ``/proc/self/io``)."""
    before = _io_write_bytes()
    action()
    return _io_write_bytes() - before


def _io_write_bytes() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("write_bytes:"))


def _engine(target_ref: str, draft_ref: str | None) -> Engine:
    return open_engine(ModelChoice(model=target_ref, draft=draft_ref, no_draft=draft_ref is None),
                       KVConfig(kind="paged")).engine


def _tokens(session: ChatSession) -> dict[str, list[int]]:
    caches = session.caches
    return {role: caches.ids[:cache.offset] for role in ROLES if (cache := getattr(caches, role))}


def _new_kv_bytes(session: ChatSession, before: dict[str, list[int]]) -> int:
    """KV bytes of the tokens the turn computed: each cache's tokens after what it kept from ``before``.

    More than the cache grew by when the turn rewound it: Qwen3's template drops the last reply's
    think block from the history, so the turn recomputes that reply (see ChatSession's cache reuse).
    """
    total = 0
    for role, tokens in before.items():
        cache = getattr(session.caches, role)
        held = session.caches.ids[:cache.offset]
        total += (cache.offset - common_prefix_length(tokens, held)) * cache.geometry.token_bytes
    return total


def _save_and_checkpoint(store: SessionStore, session: ChatSession) -> None:
    store.save(session)
    store.checkpoint()  # the WAL's pages into the database: counted in this save


def _file_rewrite(session: ChatSession, path: Path) -> int:
    """Bytes of the old autosave: the whole chat rewritten as one file (after a first save of it)."""
    session.save(path)
    return written_bytes(lambda: session.save(path))


def _random_chat(engine: Engine, seed: int, tokens: int) -> ChatSession:
    """A chat of ``tokens`` distinct random tokens whose caches hold random values (no forward pass)."""
    session = ChatSession(engine, SYSTEM, GenerationParams(max_tokens=24))
    for turn in range(6):
        session.messages += [Message("user", long_message(seed * 6 + turn)), Message("assistant", "Noted.")]
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, engine.model.args.vocab_size, tokens).tolist()
    for role in ROLES:
        cache = getattr(session.caches, role)
        if cache is None:
            continue
        g = cache.geometry
        values = {f"{i}.{name}": mx.array(rng.standard_normal((1, g.kv_heads, tokens, g.head_dim), np.float32))
                  .astype(g.dtype) for i in range(g.num_layers) for name in ("keys", "values")}
        cache.release()
        setattr(session.caches, role, engine.restore_cache(role, values, {"kind": "paged", "tokens": ids,
                                                                         "block_size": engine.kv.block_size}))
    session.caches.ids = ids  # the caches' owner gives the ids they hold (a store's save reads them)
    return session


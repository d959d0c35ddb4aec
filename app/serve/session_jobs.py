"""Saving and restoring conversations in the session store, on the engine thread (through ``worker.call``).

Save: the conversation the client sends is read by the scheduler like any
prompt (paced beside the running streams, its prefix in the KV pool reused) as a
request for one token whose caches come back (``Request.keep_caches``); here they
become a ``ChatSession``'s, written to the store under ``name``, like the chat
window's autosave; the window and `mlxchat sessions` see it. Restore: the stored chat is
opened, its KV blocks go into the pool and stay held (the last few restored
chats), so the client's next request on that conversation computes only what
is new, like llama.cpp's slot restore. When the model is unloaded (idle, or evicted), the
chats saved or restored last are restored again from the store as it loads back
(``recent`` and ``restore_again``), so their next request is not recomputed either.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from pathlib import Path

from mlxcore import Caches
from mlxcore import Request
from mlxcore import Engine, GenerationParams, MlxchatError
from mlxcore import CacheStateError
from sessions import ChatSession
from sessions import Message
from sessions import SessionStore
from app.flags import in_flags

log = logging.getLogger("mlxchat.serve")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # the store's ids: no paths, no dots


def is_session_name(name: str) -> bool:
    return NAME.fullmatch(name) is not None


def conversation(engine: Engine, messages: list[dict], enable_thinking: bool) -> ChatSession:
    """A session holding ``messages`` (the system prompt first, when there is one), with empty caches."""
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    session = ChatSession(engine, system=system, enable_thinking=enable_thinking)
    session.messages += [Message(m["role"], m["content"]) for m in messages[1 if system is not None else 0:]]
    return session


def save_request(ids: list[int]) -> Request:
    """The scheduler's request that reads a conversation's ``ids`` into caches it hands back (one greedy
    token past them, which ``SessionJobs.save`` takes back)."""
    return Request(prompt_ids=tuple(ids), params=GenerationParams(temperature=0.0, max_tokens=1), keep_caches=True)


def take_back_extra(caches: Caches, tokens: int) -> None:
    """Rewind both caches to the conversation's ``tokens`` (a reply's token may be in them)."""
    for cache in (caches.target, caches.draft):
        extra = cache.offset - tokens if cache is not None else 0
        if extra > 0 and cache.trim(extra) != extra:
            raise CacheStateError(f"The KV cache could not be rewound to the conversation's {tokens} tokens.")


class SessionJobs:
    """The store, the jobs, and the caches of recently restored chats (held so that their blocks stay)."""

    def __init__(self, root: Path | None, pinned: int = 4) -> None:
        self.root, self.pinned = root, pinned
        self._store: SessionStore | None = None  # opened on the engine thread, used only there
        self._held: OrderedDict[str, Caches] = OrderedDict()
        self._recent: OrderedDict[str, None] = OrderedDict()  # saved or restored last, at most ``pinned``

    @property
    def opened(self) -> bool:
        """Whether a job ran: the store is open, or chats are held (``close`` has work to do)."""
        return self._store is not None or bool(self._held)

    def store(self) -> SessionStore:
        if self._store is None:
            self._store = SessionStore(self.root)
        return self._store

    def save(self, engine: Engine, name: str, messages: list[dict], enable_thinking: bool,
             title: str | None, caches: Caches, tokens: int) -> dict:
        """Store the conversation with ``caches`` (from ``save_request``, holding its ``tokens``), which
        then go back to the pool (their blocks stay cached for the next request)."""
        session = conversation(engine, messages, enable_thinking)
        session.caches.release()
        session.caches = caches
        session.title = title
        try:
            take_back_extra(caches, tokens)
            store = self.store()
            try:
                store.save(session, session_id=name)
            finally:
                store.release(name)  # let the chat window open it
        finally:
            session.caches.release()
        self._touch(name)
        return {"name": name, "messages": len(messages), "cached_tokens": tokens}

    def restore(self, engine: Engine, name: str) -> dict:
        store = self.store()
        try:
            session = store.load(name, engine)
        finally:
            store.release(name)
        self._hold(name, session.caches)
        self._touch(name)
        return {"name": name, "messages": [m.as_dict() for m in session.history],
                "enable_thinking": session.enable_thinking, "cached_tokens": session.caches.target.offset,
                "note": in_flags(session.restore_note) if session.restore_note else None}

    def _hold(self, name: str, caches: Caches) -> None:
        old = self._held.pop(name, None)
        if old is not None:
            old.release()
        self._held[name] = caches
        while len(self._held) > self.pinned:
            self._held.popitem(last=False)[1].release()

    def _touch(self, name: str) -> None:
        self._recent.pop(name, None)
        self._recent[name] = None
        while len(self._recent) > self.pinned:
            self._recent.popitem(last=False)

    @property
    def recent(self) -> list[str]:
        """The chats saved or restored last (oldest first): what an unloaded model restores as it loads again."""
        return list(self._recent)

    def restore_again(self, engine: Engine, names: list[str]) -> int:
        """Restore ``names`` (an unloaded model's ``recent``) into this model's pool, held as ``restore`` holds
        them; the tokens restored. A chat gone from the store, or that no longer opens, is skipped and logged."""
        tokens = 0
        for name in names:
            try:
                tokens += self.restore(engine, name)["cached_tokens"]
            except MlxchatError as error:
                log.warning("the saved chat %s was not restored: %s", name, error)
        return tokens

    def close(self) -> None:
        for caches in self._held.values():
            caches.release()
        self._held.clear()
        if self._store is not None:
            self._store.close()

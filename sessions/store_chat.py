"""One chat in the session store: save a ChatSession incrementally, read it back, export it as one file.

A save cuts each cache into blocks (``cut_chat``, kv_blocks.py), then ``commit_chat``
writes only the blocks the store does not have yet (block_files.py) and commits the
chat's row, new messages and block list in one index transaction (store_index.py).
The commit is the one step
that changes what the chat is, so a crash at any moment leaves the state of the
last commit: block files are whole before the index may name them, and blocks
written for a save that never committed are garbage for store_gc.py.

The index holds the session header (file_header.py) split in parts: what lists
show in columns, history in rows, cached token ids in the block rows, the rest as
JSON. ``saved_header`` puts it together again, and the same checks as for a file
(``read_saved_session``) run on it before anything is built.

The draft's cache is stored with the target's, not prefilled again on open: with the
embedded pair, opening a 3,656-token chat and answering took 0.023 of a cold re-prefill
with the draft's blocks read, 0.31 with the draft prefilled again, for 14% more bytes
(bench/studies/store_choices.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx

from sessions.block_files import BlockFileError, BlockFiles
from sessions.block_keys import tokens_from
from sessions.errors import SessionFileError
from sessions.file_format import encode_header
from sessions.file_header import ROLES_SAVED, SavedSession, read_saved_session
from sessions.kv_blocks import CacheBlocks, cache_blocks, tensors_from_blocks
from sessions.file_save import convert_whole
from sessions.header_types import Header
from sessions.session_file import Opened, checked, restore_plan, saved_caches, session_header
from sessions.store_gc import BlockLock
from sessions.store_index import ChatRecord, StoreIndex, StoredBlock

if TYPE_CHECKING:
    from mlxcore import Engine
    from sessions.chat_session import ChatSession

_IN_COLUMNS = ("title", "created", "updated", "history")


@dataclass(frozen=True)
class SaveReport:
    """What one save wrote."""

    blocks_written: int
    bytes_written: int  # of the block files written (the index's pages not counted)
    blocks_kept: int  # blocks the store had already (this chat's earlier turns, or another chat's)
    dropped: tuple[str, ...]  # keys the chat no longer holds: candidates for GC


@dataclass
class ChatCut:
    """A session cut into what the store keeps: its header and its caches' blocks (not written yet)."""

    header: Header
    blocks: dict[str, CacheBlocks]  # role -> blocks

    def encode_all(self) -> None:
        """Encode every block now, so that ``commit_chat`` needs no MLX (the kill test forks after this)."""
        for cut in self.blocks.values():
            cut.encode_all()


def cut_chat(session: ChatSession, created: float) -> ChatCut:
    """Cut ``session`` into its header and blocks (MLX work; nothing is written)."""
    engine = session.engine
    fingerprints = {"target": engine.fingerprint, "draft": engine.draft_fingerprint}
    blocks = {role: cache_blocks(cache, session.caches.ids, fingerprints[role], role)
              for role, cache in saved_caches(session).items()}
    header = session_header(session, {role: (cut.geometry, cut.meta) for role, cut in blocks.items()}, created)
    encode_header(header)  # the same size limit as a file's header, checked before anything is written
    return ChatCut(header, blocks)


def commit_chat(index: StoreIndex, chat: str, cut: ChatCut) -> SaveReport:
    """Write the blocks the store lacks, then commit the chat's index rows: the one step that changes it."""
    files = BlockFiles(index.root)
    with BlockLock(index.root).shared():  # from "which blocks exist" to the commit (store_gc.py)
        refs = {ref.key for blocks in cut.blocks.values() for ref in blocks.refs}
        missing = {key for key in refs if not files.has(key)}
        payloads = {key: data for blocks in cut.blocks.values() for key, data in blocks.payloads(missing).items()}
        written = files.write_many(payloads)
        record = _record(cut.header, {role: tuple(blocks.rows) for role, blocks in cut.blocks.items()})
        dropped = index.write(chat, record)
    return SaveReport(len(payloads), written, len(refs) - len(missing), tuple(dropped))


def read_saved(index: StoreIndex, chat: str) -> SavedSession | None:
    """The checked header of ``chat`` (no cache read), or None when the store has no such chat."""
    record = index.read(chat)
    return None if record is None else read_saved_session(saved_header(record), _where(index.root, chat))


def load_chat(index: StoreIndex, chat: str, engine: Engine) -> Opened | None:
    """``chat`` read and checked for ``engine`` (None when there is no such chat); ``ChatSession.opened`` builds
    the session, as it does of a file (``session_file.read_session``).

    A missing or damaged block costs the cache, not the chat: the conversation opens
    and the cache is rebuilt by the next turn, as ``restore_note`` says.
    """
    root, where = index.root, _where(index.root, chat)
    with BlockLock(root).shared():  # the blocks of the state read stay until they are read
        record = index.read(chat)
        if record is None:
            return None
        saved = read_saved_session(saved_header(record), where)
        restore, notes = restore_plan(saved, engine, f"Chat {chat}")
        try:
            tensors = _tensors(root, saved, record, restore, where)
        except SessionFileError as error:  # the header passed: only cache data is damaged
            if isinstance(error, BlockFileError) and error.key is not None:
                BlockFiles(root).remove(error.key)  # a damaged block: the next save writes it again
            restore, tensors = [], {}
            notes = [f"Its saved cache could not be read ({error}): the conversation is restored and its "
                     "cache will be rebuilt on the next turn."]
    return checked(saved, engine, tensors, restore, notes, where)


def export_file(index: StoreIndex, chat: str, path: Path) -> bool:
    """Write ``chat`` as one self-contained session file at ``path`` (False when there is no such chat)."""
    root, where = index.root, _where(index.root, chat)
    with BlockLock(root).shared():
        record = index.read(chat)
        if record is None:
            return False
        header = saved_header(record)
        saved = read_saved_session(header, where)
        tensors = _tensors(root, saved, record, [r for r in ROLES_SAVED if getattr(saved, r) is not None], where)
    convert_whole(saved, header, tensors, Path(path))  # compact, in the appending layout
    return True


def saved_header(record: ChatRecord) -> dict[str, object]:
    """The session header (as a file holds it) of an index record (not checked yet: ``read_saved_session``)."""
    header: dict[str, object] = dict(
        record.header, title=record.title, created=record.created, updated=record.updated,
        history=[{"role": role, "content": content} for role, content in record.history])
    stored = header.get("cache")
    if isinstance(stored, dict):
        header["cache"] = cache = dict(stored)
        for role in ROLES_SAVED:
            if isinstance(saved := cache.get(role), dict):
                ids = [t for block in record.blocks.get(role, ()) for t in tokens_from(block.tokens)]
                cache[role] = dict(saved, tokens=ids)
    return header


def _record(header: Header, blocks: dict[str, tuple[StoredBlock, ...]]) -> ChatRecord:
    rest = {key: value for key, value in header.items() if key not in _IN_COLUMNS}
    rest["cache"] = {key: ({k: v for k, v in value.items() if k != "tokens"} if isinstance(value, dict) else value)
                     for key, value in header["cache"].items()}
    model = header["model"]["name"] or header["model"]["fingerprint"]
    history = tuple((m["role"], m["content"]) for m in header["history"])
    return ChatRecord(header["title"], header["created"], header["updated"], model, rest, history, blocks)


def _tensors(root: Path, saved: SavedSession, record: ChatRecord, roles: list[str], where: str) -> dict[str, mx.array]:
    files = BlockFiles(root)
    tensors: dict[str, mx.array] = {}
    for role in roles:
        tensors |= tensors_from_blocks(saved, role, record.blocks.get(role, ()), files.read, where)
    return tensors


def _where(root: Path, chat: str) -> str:
    return f"chat {chat} in {root}"

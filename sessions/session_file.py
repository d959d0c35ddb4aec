"""Save a ChatSession to one file and read it again: ``save_session``, and ``read_session`` and
``restore_caches`` (which ``ChatSession.load`` calls: the session is built there, so that this module does not
import it back).

The file holds a JSON header (file_header.py) and the target's and draft's caches,
quantized ones as the pool stores them (saved_kv.py): as KV blocks in the appending
layout that saves write (format 3: file_layout.py, file_save.py), or as one
safetensors payload in the whole files of formats 1 and 2 (file_format.py), which
still open; the first save after opening one writes the appending layout. Loading
checks the whole file first, then the session is built; a file made with another
model, with another kind of KV cache, or with a rotating window that has less
rewind room than this engine's drafts need, restores its conversation and leaves
the cache to be rebuilt by the next turn's prefill, saying so in ``session.restore_note``. A paged cache saved
in another KV format than the engine's (float, 8-bit) is converted through float
into the engine's pool, and the note says so too.

Over several ranks (``engine.world``) the file holds every rank's KV heads:
rank 0 reads and writes it, the others get its bytes and give their heads.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx

from mlxcore import Caches
from mlxcore import share
from mlxcore import HybridCache, ModelCache
from mlxcore import CacheShapeError, CacheStateError
from mlxcore import KVGeometry
from sessions.errors import SessionFileError
from sessions.file_append import FileMark, mark_of, write_whole
from sessions.file_format import encode_header
from sessions.file_header import ROLES_SAVED, appending_version, SavedCache, SavedSession, build_header, read_saved_session
from sessions.file_read import FileContents, read_contents
from sessions.file_save import convert_whole, write_session_file
from sessions.header_types import Header
from sessions.kv_blocks import CacheBlocks, saved_keys, state_blocks, tensors_from_blocks
from sessions.safetensors_payload import decode_tensors, dtype_name
from sessions.store_index import StoredBlock
from sessions.saved_kv import describe
from sessions.terminal_text import printable

# Kinds whose restore (``ModelCache.from_state``) converts another KV format through float; a rotating
# window keeps the format it was saved in, so one saved in another format is rebuilt instead.
CONVERTING_KINDS = ("paged",)

if TYPE_CHECKING:
    from mlxcore import CacheMeta, Engine
    from sessions.chat_session import ChatSession


def save_session(session: ChatSession, path: Path) -> None:
    """Write ``session`` (conversation, settings, caches) to ``path``: appended when the session was read
    from or saved to that file, else whole (file_save.py). A crash leaves the file's previous state."""
    engine = session.engine
    fingerprints = {"target": engine.fingerprint, "draft": engine.draft_fingerprint}
    cuts = {role: _state_blocks(engine, role, cache, session.caches.ids, fingerprints[role])
            for role, cache in saved_caches(session).items()}
    created = share(engine.world, lambda: getattr(session, "created_at", None) or time.time())
    header = session_header(session, {role: (cut.geometry, cut.meta) for role, cut in cuts.items()}, created)
    data = encode_header({**header, "version": appending_version(header)})
    known = session.saved_files.get(os.path.realpath(path))
    # Rank 0 writes; the others hear how it went (a full disk fails the save on every rank alike).
    mark = share(engine.world, lambda: write_session_file(Path(path), data, cuts, known))
    session.saved_files[mark.path] = mark
    session.created_at = created


def _state_blocks(engine: Engine, role: str, cache: ModelCache, ids: list[int], fingerprint: str) -> CacheBlocks:
    """The blocks of ``cache``, holding the first of ``ids``, with every rank's heads (``Engine.cache_state``)."""
    geometry, tensors, meta = engine.cache_state(role, cache, ids)
    return state_blocks(geometry, tensors, meta, fingerprint, role)


def saved_caches(session: ChatSession) -> dict[str, ModelCache]:
    """The caches a save writes: role ("target", "draft") -> cache, for those the session has."""
    return {role: cache for role in ROLES_SAVED if (cache := getattr(session.caches, role)) is not None}


def session_header(session: ChatSession, caches: dict[str, tuple[KVGeometry, CacheMeta]], created: float) -> Header:
    """The header of ``session``; ``caches``: role -> (geometry, ``state_dict`` metadata)."""
    engine = session.engine
    return build_header(
        created=created, title=session.title, model=(_name(engine, "model_name"), engine.fingerprint),
        draft=(_name(engine, "draft_name"), engine.draft_fingerprint) if engine.draft_model is not None else None,
        params=session.params, enable_thinking=session.enable_thinking, use_draft=session.use_draft,
        messages=session.messages, kind=_kind(session.caches.target), caches=caches)


def _kind(cache: ModelCache) -> str:
    """The KV kind a file names: a hybrid model's is that of its attention layers."""
    return cache.attention.kind if isinstance(cache, HybridCache) else cache.kind


@dataclass
class Opened:
    """A session file's or a stored chat's contents, checked: what ``ChatSession.opened`` builds a session of."""

    saved: SavedSession
    tensors: dict[str, mx.array]  # the caches to restore, by tensor name ("target.…", "draft.…")
    restore: list[str]  # the roles whose caches are restored ("target", "draft"); the others are rebuilt
    notes: list[str] = field(default_factory=list)  # for the user: what is rebuilt or converted, and why
    where: str = ""  # the file or chat, for errors
    mark: FileMark | None = None  # a file in the appending layout: its next save appends


def read_session(path: Path, engine: Engine) -> Opened:
    """The session file ``path`` read and checked for ``engine``; ``SessionFileError`` if it is not a valid one.
    Everything is read and checked before a session is built (``ChatSession.load``)."""
    where = str(path)
    contents = share(engine.world, lambda: read_contents(Path(path)))  # rank 0's file, over several ranks
    saved = read_saved_session(contents.header, where)
    tensors, keys = cache_tensors(saved, contents, where)
    check_tensors(saved, tensors, where)
    restore, notes = restore_plan(saved, engine, Path(path).name)
    if contents.torn:
        notes.insert(0, f"{Path(path).name} ends in a save that did not finish ({contents.torn:,} bytes): it opens "
                        "at its last complete save.")
    opened = checked(saved, engine, tensors, restore, notes, where)
    if contents.commit is not None:  # the next save of this file appends to it
        opened.mark = mark_of(Path(path), contents.commit, keys, contents.stat)
    return opened


def cache_tensors(saved: SavedSession, contents: FileContents, where: str) -> tuple[dict[str, mx.array],
                                                                                dict[str, list[str]]]:
    """The cache tensors a file holds, and (appending layout) the keys of its blocks per role."""
    if contents.payload is not None:  # a whole file (formats 1 and 2)
        return decode_tensors(contents.payload, where), {}
    assert contents.blocks is not None, "a file has a payload or blocks"
    described = set(saved.roles)
    if set(contents.blocks) != described:
        raise SessionFileError(f"{where}: its index names the caches {sorted(contents.blocks)}, its header "
                               f"{sorted(described)}: the file is inconsistent.")
    tensors: dict[str, mx.array] = {}
    keys: dict[str, list[str]] = {}
    for role, payloads in contents.blocks.items():
        keys[role] = saved_keys(saved, role, payloads)
        if len(keys[role]) != len(payloads):
            raise SessionFileError(f"{where}: its index lists {len(payloads)} blocks of the {role} cache, its "
                                   f"tokens fill {len(keys[role])}: the file is inconsistent.")
        read = dict(zip(keys[role], payloads)).__getitem__
        rows = [StoredBlock(key, b"") for key in keys[role]]
        tensors |= tensors_from_blocks(saved, role, rows, read, where)  # each block's ids and size checked
    return tensors, keys


def checked(saved: SavedSession, engine: Engine, tensors: dict[str, mx.array], restore: list[str],
            notes: list[str], where: str) -> Opened:
    """``saved`` with the tensors of its ``restore`` caches (checked already), once they fit ``engine``."""
    for role in restore:
        if not saved.cache(role).fits(engine.whole_geometry(role)):
            raise SessionFileError(f"{where}: its {role} cache does not fit the model it was saved with "
                                   "(same fingerprint, other shape): the file is inconsistent.")
    return Opened(saved, tensors, restore, notes, where)


def check_tensors(saved: SavedSession, tensors: dict[str, mx.array], where: str) -> None:
    """The payload must hold exactly the tensors the header describes, in their shapes and dtypes."""
    expected = saved.tensor_shapes()
    for name in sorted(set(tensors) | set(expected)):
        if name not in tensors:
            raise SessionFileError(f"{where}: the cache tensor {name!r} is missing.")
        if name not in expected:
            raise SessionFileError(f"{where}: unexpected tensor {name!r} (the header does not describe it).")
        found = (dtype_name(tensors[name].dtype), tuple(tensors[name].shape))
        if found != expected[name]:
            raise SessionFileError(f"{where}: tensor {name!r} is {found[0]} {found[1]}, "
                                   f"the header says {expected[name][0]} {expected[name][1]}.")


def restore_plan(saved: SavedSession, engine: Engine, name: str) -> tuple[list[str], list[str]]:
    """Which saved caches fit ``engine`` (["target", "draft"] or fewer), and notes on the others."""
    if saved.cache_kind != engine.kv.kind or not _window_fits(saved, engine):
        was = f"the {saved.cache_kind} KV cache" if saved.cache_kind != engine.kv.kind else "another cache window"
        return [], [f"{name} was saved with {was}: the cache will be rebuilt on the next turn."]
    restore, notes = [], []
    if saved.target is not None:
        if saved.model_fingerprint == engine.fingerprint:
            restore.append("target")
        else:
            model = printable(saved.model_name or saved.model_fingerprint)  # the file's text, for a terminal
            notes.append(f"{name} was saved with another model ({model}): "
                         "the conversation is restored and its cache will be rebuilt on the next turn.")
    if saved.draft is not None and engine.draft_model is not None and saved.use_draft:
        if saved.draft_fingerprint == engine.draft_fingerprint:
            restore.append("draft")
        else:
            notes.append("It was saved with another draft model: the draft's cache will be rebuilt.")
    if any(not _rewind_room_fits(saved.cache(role), engine) for role in restore):
        return [], [f"{name} was saved with a rotating window that rewinds fewer tokens than "
                    f"num_draft={engine.draft_control.max_k} needs: the cache will be rebuilt on the next turn."]
    return restore, notes


def _window_fits(saved: SavedSession, engine: Engine) -> bool:
    if saved.cache_kind != "rotating" or saved.target is None:
        return True
    max_kv: int | None = engine.kv.max_kv
    return saved.target.state["max_size"] == max_kv


def _rewind_room_fits(cache: SavedCache, engine: Engine) -> bool:
    """A rotating window needs spare slots for the engine's longest drafts (see Engine.rewind_room)."""
    room: int = engine.rewind_room
    return cache.state.get("max_rewind", room) >= room


def restore_caches(opened: Opened, session: ChatSession) -> None:
    """Put ``opened``'s caches into ``session`` (new, built from ``opened.saved``), and its note for the user."""
    restore, format_notes = _format_plan(opened.saved, session.caches, opened.restore)
    session.restore_note = " ".join(opened.notes + format_notes) or None
    restored: list[ModelCache] = []
    try:
        for role in restore:  # the plan names the draft only when this session decodes with it
            cache = _restore_cache(session.engine, role, opened.saved, opened.tensors)
            restored.append(cache)
            getattr(session.caches, role).release()
            setattr(session.caches, role, cache)
    except (CacheStateError, CacheShapeError) as error:
        for cache in restored:
            cache.release()
        raise SessionFileError(f"{opened.where}: its cache cannot be restored: {error}") from None
    if restore:  # each holds a start of the conversation: the longest says its ids
        session.caches.ids = max((list(opened.saved.cache(role).tokens) for role in restore), key=len)
    if opened.mark is not None:
        session.saved_files[opened.mark.path] = opened.mark


def _format_plan(saved: SavedSession, fresh: Caches, restore: list[str]) -> tuple[list[str], list[str]]:
    """Of the caches to restore, those saved in another KV format than ``fresh`` (the engine's) are converted
    (``CONVERTING_KINDS``) or left to be rebuilt; (caches to restore, notes for the user)."""
    changed = [role for role in restore if saved.cache(role).kv_format != getattr(fresh, role).geometry.format]
    if not changed:
        return restore, []
    was, now = saved.cache(changed[0]).kv_format, getattr(fresh, changed[0]).geometry.format
    told = f"This chat was saved with {describe(was)} and this engine keeps {describe(now)}"
    if saved.cache_kind in CONVERTING_KINDS:
        return restore, [f"{told}: its cache was converted, so replies may differ slightly from the saved "
                         "chat's."]
    return [role for role in restore if role not in changed], [f"{told}: the cache will be rebuilt on the next turn."]


def _restore_cache(engine: Engine, role: str, saved: SavedSession, tensors: dict[str, mx.array]) -> ModelCache:
    """Rebuild one cache; paged caches join the engine's block pool (sharing prefix blocks)."""
    prefix = f"{role}."
    own = {name[len(prefix):]: array for name, array in tensors.items() if name.startswith(prefix)}
    cache: ModelCache = engine.restore_cache(role, own, saved.cache(role).meta(saved.cache_kind))
    return cache


def _name(engine: Engine, attribute: str) -> str:
    return str(getattr(engine, attribute) or "")


def export_compact(source: Path, path: Path) -> FileMark:
    """Write the session file ``source`` (any layout, every checksum and header field checked first) to
    ``path`` whole and compact, in the appending layout."""
    read = read_contents(source)
    saved = read_saved_session(read.header, str(source))
    tensors = cache_tensors(saved, read, str(source))[0]  # the blocks' ids and sizes checked too
    if read.blocks is None:
        return convert_whole(saved, read.header, tensors, path)
    named = {role: [(f"{role}.{n}", block) for n, block in enumerate(blocks)] for role, blocks in read.blocks.items()}
    return write_whole(path, encode_header(read.header), named)

"""Where a save of a session file goes: appended to the file as the session last knew it, or written whole.

A session remembers the files it was read from or saved to (``ChatSession.saved_files``:
``FileMark``s). Saving to one of them appends the blocks the file lacks (the partial last
block again, since its key changes as it fills) and a new record (file_append.py). A save
to any other path, to a file someone else changed since, or one whose dead space would
reach ``COMPACT_AT`` of the file, writes it whole and compact.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import mlx.core as mx

from sessions.file_append import Blocks, FileMark, append_save, write_whole
from sessions.file_layout import HEAD_BYTES, TRAILER_BYTES
from sessions.file_format import encode_header
from sessions.file_header import APPENDING_VERSION, SavedSession
from sessions.kv_blocks import CacheBlocks, state_blocks

# Dead share of a file at which a save compacts it instead of appending (docs/session_files.md has the sweep).
COMPACT_AT = 0.5
_INDEX_BYTES = 5, 28  # a record's index: per role, per block
# Blocks encoded at once by a whole write: its memory beside the caches stays small (32 blocks of the
# users' 8B target are 75 MB), where encoding every block first would hold a second copy of the chat.
_ENCODE_BLOCKS = 32


def write_session_file(path: Path, header: bytes, cuts: dict[str, CacheBlocks], mark: FileMark | None) -> FileMark:
    """Save ``header`` and the caches cut into ``cuts`` (role -> blocks) to ``path``; its new mark."""
    if mark is not None:
        missing = {ref.key for cut in cuts.values() for ref in cut.refs if ref.key not in mark.spans}
        new = {key: data for cut in cuts.values() for key, data in cut.payloads(missing).items()}
        if not _would_compact(mark, header, cuts, new):
            appended = append_save(path, mark, header, _named(cuts, new))
            if appended is not None:
                return appended
    return write_whole(path, header, {role: _encoded(cut) for role, cut in cuts.items()})


def _would_compact(mark: FileMark, header: bytes, cuts: dict[str, CacheBlocks], new: dict[str, bytes]) -> bool:
    """Whether appending would leave dead space of ``COMPACT_AT`` of the file or more."""
    index = sum(_INDEX_BYTES[0] + _INDEX_BYTES[1] * len(cut.refs) for cut in cuts.values())
    record = 4 + len(header) + 1 + index + TRAILER_BYTES
    kept = sum(mark.spans[ref.key].length for cut in cuts.values() for ref in cut.refs if ref.key in mark.spans)
    added = sum(len(data) for data in new.values())
    end, live = mark.end + added + record, HEAD_BYTES + kept + added + record
    return end - live >= COMPACT_AT * end


def _encoded(cut: CacheBlocks) -> Iterator[tuple[str, bytes]]:
    """(key, payload) of every block of ``cut`` in order, encoded a few at a time as a whole write takes them."""
    for start in range(0, len(cut.refs), _ENCODE_BLOCKS):
        refs = cut.refs[start:start + _ENCODE_BLOCKS]
        payloads = cut.payloads(ref.key for ref in refs)
        yield from ((ref.key, payloads[ref.key]) for ref in refs)


def _named(cuts: dict[str, CacheBlocks], payloads: dict[str, bytes]) -> Blocks:
    """role -> (key, payload, or None for a block the file holds already) in the cache's order."""
    return {role: [(ref.key, payloads.get(ref.key)) for ref in cut.refs] for role, cut in cuts.items()}


def convert_whole(saved: SavedSession, header: Mapping[str, object], tensors: dict[str, mx.array],
                  path: Path) -> FileMark:
    """Write a whole file's checked header and tensors (formats 1 and 2) to ``path`` in the appending layout."""
    cuts = {}
    for role in saved.roles:
        cache = saved.cache(role)
        own = {name[len(role) + 1:]: array for name, array in tensors.items() if name.startswith(f"{role}.")}
        cuts[role] = state_blocks(cache.geometry(), own, cache.meta(saved.cache_kind), saved.fingerprint(role), role)
    return write_session_file(path, encode_header({**header, "version": APPENDING_VERSION}), cuts, None)

"""Session files in each layout for the tests: an earlier mlxchat's whole file, and a format-3 file changed
at will and sealed again with valid checksums (so that only the header and block checks can refuse it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sessions.file_append import write_whole
from sessions.file_format import encode_header, open_session_file, read_file, write_file
from sessions.file_layout import is_appending, read_blocks, read_commit
from sessions.safetensors_payload import encode_tensors
from sessions.session_file import saved_caches, session_header


def save_whole(session, path: Path) -> None:
    """Save ``session`` as mlxchat wrote files before the appending layout (format 1, or 2 with 8-bit KV)."""
    engine, tensors, caches = session.engine, {}, {}
    for role, cache in saved_caches(session).items():
        geometry, arrays, meta = engine.cache_state(role, cache, session.caches.ids)
        tensors |= {f"{role}.{name}": array for name, array in arrays.items()}
        caches[role] = (geometry, meta)
    write_file(Path(path), encode_header(session_header(session, caches, 1.0e9)), encode_tensors(tensors))


def appending(path: Path) -> bool:
    with open_session_file(path) as f:
        return is_appending(os.pread(f.fileno(), 32, 0))


def contents(path: Path) -> tuple[dict, dict[str, list[bytes]] | bytes]:
    """(header, cache data): blocks per role (format 3) or the safetensors payload (formats 1 and 2)."""
    if not appending(path):
        return read_file(path)
    with open_session_file(path) as f:
        commit = read_commit(path, f, os.fstat(f.fileno()).st_size)
        return commit.header, read_blocks(path, f, commit)


def resealed(tmp_path: Path, data: bytes, change_header: Callable | None = None,
             change_payload: Callable[[bytes], bytes] | None = None) -> Path:
    """A copy of the file ``data`` with its header or cache data changed and every checksum valid again.

    ``change_payload`` gets the safetensors payload, or a format-3 file's blocks back to back (and must
    keep their length: they are cut again where they were)."""
    source = tmp_path / "source.mlxchat"
    source.write_bytes(data)
    header, cache = contents(source)
    if change_header:
        change_header(header)
    path = tmp_path / "changed.mlxchat"
    if isinstance(cache, bytes):
        write_file(path, encode_header(header), [change_payload(cache) if change_payload else cache])
        return path
    if change_payload:
        cache = _recut(cache, change_payload(b"".join(b for blocks in cache.values() for b in blocks)))
    write_whole(path, encode_header(header), {role: [(f"{role}{n}", b) for n, b in enumerate(blocks)]
                                              for role, blocks in cache.items()})
    return path


def _recut(cache: dict[str, list[bytes]], joined: bytes) -> dict[str, list[bytes]]:
    out, at = {}, 0
    for role, blocks in cache.items():
        out[role] = []
        for block in blocks:
            out[role].append(joined[at:at + len(block)])
            at += len(block)
    return out


def file_tensors(path: Path) -> dict:
    """The cache tensors a file of any layout holds ("<role>.<layer>.<name>" -> array), checked."""
    from sessions.file_header import read_saved_session
    from sessions.file_read import read_contents
    from sessions.session_file import cache_tensors

    read = read_contents(path)
    return cache_tensors(read_saved_session(read.header, str(path)), read, str(path))[0]


def cache_bytes(path: Path) -> int:
    """Bytes of a file's cache data: its safetensors payload, or its blocks."""
    cache = contents(path)[1]
    return len(cache) if isinstance(cache, bytes) else sum(len(b) for blocks in cache.values() for b in blocks)

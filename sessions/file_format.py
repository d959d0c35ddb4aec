"""The whole-file session container of formats 1 and 2: fixed preamble, JSON header, safetensors payload,
checksum. Format 3 appends saves instead (file_layout.py); ``read_header`` takes either.

Layout (integers little-endian)::

    magic            16 bytes   b"MLXCHAT-SESSION\\n"
    header_length     8 bytes   u64, at most MAX_HEADER_BYTES
    header_sha256    32 bytes   of the header bytes (lets a store list sessions without reading tensors)
    header            N bytes   UTF-8 JSON object (see file_header.py)
    payload           ...       a complete safetensors file (see safetensors_payload.py)
    file_sha256      32 bytes   of every byte before it

A changed, missing or added byte fails a size check or a checksum, so the
parsers behind it only ever see bytes this module wrote (or a forgery, which
they still validate). Writes are atomic: temporary file, fsync, rename, fsync.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

from sessions.disk_sync import sync_to_disk
from sessions.errors import SessionFileError, SessionSaveError
from sessions.file_layout import MAGIC, is_appending, parse_json, read_commit
from sessions.temp_files import sweep_dead_temps, temp_path

MAX_HEADER_BYTES = 16 * 1024 * 1024
_PREAMBLE = len(MAGIC) + 8 + 32
_DIGEST = 32
_CHUNK = 1 << 20


def encode_header(header: Mapping[str, object]) -> bytes:
    """The header as the UTF-8 JSON bytes the file holds."""
    data = json.dumps(header, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_HEADER_BYTES:
        raise SessionSaveError(f"The session header would take {len(data):,} bytes, over the limit of "
                               f"{MAX_HEADER_BYTES:,}: the conversation is too long to save.")
    return data


def write_file(path: Path, header: bytes, payload: Iterable[bytes]) -> None:
    """Write a session file to ``path`` atomically: a crash leaves the previous file (or none).

    A symlink stays one: its target is written (the rename over the link itself would replace the link).
    Temporaries that killed writers left in the folder are swept first.
    """
    path = Path(path)
    target = Path(os.path.realpath(path))
    sweep_dead_temps(target.parent, also=target.name)
    temp = temp_path(target)
    try:
        with open(temp, "wb") as out:
            digest = hashlib.sha256()
            for piece in _pieces(header, payload):
                out.write(piece)
                digest.update(piece)
            out.write(digest.digest())
            out.flush()
            sync_to_disk(out.fileno())
        os.replace(temp, target)
    except OSError as error:
        raise SessionSaveError(write_error_text(path, error)) from error
    finally:
        try:
            temp.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only folder never had the temporary file
    fsync_folder(target.parent)


def write_error_text(path: Path, error: OSError) -> str:
    """What failed when writing ``path`` atomically, in words, with what to do about it."""
    return cannot_write_text(path, error) + " An earlier save of it, if any, is intact."


def cannot_write_text(path: Path, error: OSError) -> str:
    """What failed when writing ``path``, in words, with what to do about it (one sentence)."""
    advice = None if error.errno is None else {
        errno.ENOSPC: "the disk is full: free some space",
        errno.EDQUOT: "your disk quota is used up: free some space",
        errno.EFBIG: "the file would be larger than this system allows",
        errno.EROFS: "the disk is read-only: save somewhere else",
        errno.EACCES: "there is no permission to write there: fix the folder's permissions or save elsewhere",
        errno.EPERM: "there is no permission to write there: fix the folder's permissions or save elsewhere",
        errno.ENOENT: "its folder does not exist",
        errno.ENOTDIR: "a part of its path is a file, not a folder",
        errno.EISDIR: "it is a folder: give a file name",
    }.get(error.errno)
    reason = error.strerror or str(error)
    return f"Cannot write {path}: {reason}" + (f" ({advice})" if advice else "") + "."


def rewrite_whole_header(path: Path, header: bytes) -> None:
    """Give a whole session file (formats 1 and 2) a new header, its cache data kept as it is: the file is
    rewritten atomically, like ``write_file``, its payload streamed and checked against the old file's
    checksum on the way (a damaged file is never given a fresh, valid checksum). Either layout:
    ``file_append.rewrite_header``."""
    with open_session_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        if _appending(path, f, size):
            raise SessionFileError(f"{path} is a session file of format 3 (appended saves): its header is "
                                   "rewritten by sessions.file_append.rewrite_header.")
        old = _read_checked_header(path, f, size)
        write_file(path, header, _checked_payload(path, f, old, size - _PREAMBLE - len(old) - _DIGEST))


def read_header(path: Path) -> dict[str, object]:
    """The JSON header of a session file of any layout, checked against its checksum (cache data not read)."""
    with open_session_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        if _appending(path, f, size):
            return read_commit(path, f, size).header
        return parse_json(path, _read_checked_header(path, f, size))


def open_session_file(path: Path) -> BinaryIO:
    """``path`` open for reading; ``SessionFileError`` saying why it cannot be."""
    return _open(path)


def read_start(path: Path, f: BinaryIO, size: int) -> bytes:
    """The first bytes of a session file, which say its layout; ``SessionFileError`` if it is none."""
    start = os.pread(f.fileno(), _PREAMBLE, 0)
    if not MAGIC.startswith(start[: len(MAGIC)]):  # a short prefix of MAGIC is a truncated file
        raise SessionFileError(f"{path} is not an mlxchat session file (it does not start like one).")
    return start


def _appending(path: Path, f: BinaryIO, size: int) -> bool:
    return is_appending(read_start(path, f, size))


def read_file(path: Path) -> tuple[dict[str, object], bytes]:
    """(header, payload bytes) of a whole session file (formats 1 and 2), after every size and checksum check
    passed. Either layout: ``file_read.read_contents``."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if _appending(path, f, size):
            raise SessionFileError(f"{path} is a session file of format 3 (appended saves), not a whole file: "
                                   "read it with sessions.file_read.read_contents.")
        header = _read_checked_header(path, f, size)
        payload_length = size - _PREAMBLE - len(header) - _DIGEST
        payload = _read_exactly(path, f, payload_length)
        stored = _read_exactly(path, f, _DIGEST)
    digest = hashlib.sha256(_preamble(header))
    digest.update(header)
    digest.update(payload)
    if digest.digest() != stored:
        raise SessionFileError(f"{path} is damaged: its contents do not match their checksum "
                               "(truncated, or changed after it was saved).")
    return parse_json(path, header), payload


# internals -------------------------------------------------------------------------------------

def _pieces(header: bytes, payload: Iterable[bytes]) -> Iterable[bytes]:
    yield _preamble(header)
    yield header
    yield from payload


def _checked_payload(path: Path, f: BinaryIO, header: bytes, length: int) -> Iterable[bytes]:
    digest = hashlib.sha256(_preamble(header))
    digest.update(header)
    while length > 0:
        piece = _read_exactly(path, f, min(length, _CHUNK))
        digest.update(piece)
        length -= len(piece)
        yield piece
    if digest.digest() != _read_exactly(path, f, _DIGEST):
        raise SessionFileError(f"{path} is damaged: its contents do not match their checksum "
                               "(truncated, or changed after it was saved).")


def _preamble(header: bytes) -> bytes:
    return MAGIC + struct.pack("<Q", len(header)) + hashlib.sha256(header).digest()


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise SessionFileError(f"There is no session file {path}.") from None
    except IsADirectoryError:
        raise SessionFileError(f"{path} is a folder, not a session file.") from None
    except OSError as error:
        raise SessionFileError(f"Cannot read {path}: {error.strerror or error}.") from error


def _read_checked_header(path: Path, f: BinaryIO, size: int) -> bytes:
    """Check the preamble, then read the header (its length is checked before it is read)."""
    start = f.read(_PREAMBLE)
    if not MAGIC.startswith(start[: len(MAGIC)]):  # a short prefix of MAGIC is a truncated file
        raise SessionFileError(f"{path} is not an mlxchat session file (it does not start like one).")
    if size < _PREAMBLE + _DIGEST:
        raise SessionFileError(f"{path} is truncated: {size} bytes, too short for a session file.")
    (length,) = struct.unpack("<Q", start[len(MAGIC): len(MAGIC) + 8])
    if length > MAX_HEADER_BYTES:
        raise SessionFileError(f"{path} declares a header of {length:,} bytes, over the limit of "
                               f"{MAX_HEADER_BYTES:,}: it is corrupted or not a session file.")
    if _PREAMBLE + length + _DIGEST > size:
        raise SessionFileError(f"{path} is truncated: its header needs {length:,} bytes, "
                               f"the file holds {size:,} in all.")
    header = _read_exactly(path, f, length)
    if hashlib.sha256(header).digest() != start[len(MAGIC) + 8:]:
        raise SessionFileError(f"{path} is corrupted: its header does not match its checksum.")
    return header


def _read_exactly(path: Path, f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:  # the file shrank while being read
        raise SessionFileError(f"{path} is truncated: it ended while being read.")
    return data


def fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); some platforms cannot open folders."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        sync_to_disk(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

"""The appending session-file layout (session format 3): a save appends what changed and commits with a trailer.

Layout (integers little-endian)::

    head        32 bytes  MAGIC (16, as formats 1 and 2), APPEND_TAG (7), the layout version (1 byte: 3), and
                          an 8-byte blake2b of those 24 (a flipped version byte is damage, not a newer file)
    per save:
      blocks    ...       the KV blocks this save added (kv_blocks.py's payloads), back to back
      record    ...       u32 header length, the JSON header (file_header.py, version 3), then the index:
                          u8 role count; per role u8 role (0 target, 1 draft) and u32 block count; per
                          block u64 offset, u32 length, 16-byte blake2b of its payload
      trailer   64 bytes  TRAILER_MAGIC (8), u64 record offset, u64 record length, sha256 of the record
                          (32), 8-byte blake2b of those 56 bytes

The index names every block the save's caches hold, in order, wherever in the file it
was written (an earlier save, or this one); blocks no save names any more are dead space
until a compaction rewrites the file whole. The last trailer whose own check passes is
the file's state: bytes after it are a save that never finished (a crash, a full disk),
and the file opens at the save before, saying so. A trailer that checks but whose record
or blocks do not is damage, never a torn save (the trailer is written after an fsync of
what it names), and the file is refused.

A reader of formats 1 and 2 reads APPEND_TAG as a header length over its limit and refuses
the file. Pure Python (no MLX): the chat window's process reads headers too.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NoReturn

from sessions.errors import SessionFileError

MAGIC = b"MLXCHAT-SESSION\n"  # every format's first bytes
APPEND_TAG = b"\xffAPPEND"
LAYOUT_VERSION = 3
HEAD_BYTES = 16 + len(APPEND_TAG) + 1 + 8
TRAILER_MAGIC = b"\x00COMMIT\n"  # NUL and newline never appear raw in the compact JSON of a header
TRAILER_BYTES = 64
BLOCK_DIGEST = 16
ROLES = ("target", "draft")  # index order and role numbers
MAX_RECORD_HEADER = 16 * 1024 * 1024
_SCAN_CHUNK = 1 << 20
_BLOCK_ENTRY = struct.Struct("<QI16s")


@dataclass(frozen=True)
class Span:
    """Where one block's payload lies in the file, and its checksum."""

    offset: int
    length: int
    digest: bytes  # blake2b, BLOCK_DIGEST bytes


@dataclass(frozen=True)
class Commit:
    """The last complete save of a file: its header, its index, where it ends."""

    header: dict[str, object]  # the JSON header as read: file_header.read_saved_session checks it
    index: dict[str, tuple[Span, ...]]  # role -> its cache's blocks in order
    end: int  # just past its trailer
    trailer: bytes  # the trailer's bytes (an appending writer checks the file still ends with them)
    torn: int  # bytes after it: a save that never finished

    @property
    def live_bytes(self) -> int:
        """Bytes this save needs: the head, its blocks, its record and trailer (the rest is dead space)."""
        record: int = struct.unpack_from("<Q", self.trailer, 16)[0]
        return HEAD_BYTES + sum(s.length for spans in self.index.values() for s in spans) + record + TRAILER_BYTES


def head(version: int = LAYOUT_VERSION) -> bytes:
    start = MAGIC + APPEND_TAG + bytes([version])
    return start + hashlib.blake2b(start, digest_size=8).digest()


def is_appending(start: bytes) -> bool:
    """Whether a file's first bytes (MAGIC already matched) are this layout's head."""
    return start[16:16 + len(APPEND_TAG)] == APPEND_TAG


def block_digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=BLOCK_DIGEST).digest()


def encode_record(header: bytes, index: dict[str, list[Span]]) -> bytes:
    """A save's record: the header's JSON bytes and the index of the blocks its caches hold."""
    parts = [struct.pack("<I", len(header)), header, struct.pack("<B", len(index))]
    for role, spans in index.items():
        parts.append(struct.pack("<BI", ROLES.index(role), len(spans)))
        parts += [_BLOCK_ENTRY.pack(s.offset, s.length, s.digest) for s in spans]
    return b"".join(parts)


def encode_trailer(record_offset: int, record: bytes) -> bytes:
    body = TRAILER_MAGIC + struct.pack("<QQ", record_offset, len(record)) + hashlib.sha256(record).digest()
    return body + hashlib.blake2b(body, digest_size=8).digest()


# reading ---------------------------------------------------------------------------------------

def read_commit(path: str | Path, f: BinaryIO, size: int) -> Commit:
    """The file's last complete save (``f`` at any position); ``SessionFileError`` if it has none or is damaged."""
    start = _read_at(path, f, 0, HEAD_BYTES) if size >= HEAD_BYTES else b""
    if start[:-8] and hashlib.blake2b(start[:-8], digest_size=8).digest() != start[-8:]:
        raise SessionFileError(f"{path} is corrupted: its first {HEAD_BYTES} bytes do not match their checksum.")
    if not start:
        raise SessionFileError(f"{path} is truncated: {size} bytes, too short for a session file.")
    version = start[HEAD_BYTES - 9]
    if version > LAYOUT_VERSION:
        raise SessionFileError(f"{path} was saved by a newer mlxchat (session layout {version}; this one reads "
                               f"{LAYOUT_VERSION}): update mlxchat to open it.")
    if version != LAYOUT_VERSION:
        raise SessionFileError(f"{path} is corrupted: its head names session layout {version}, which does not exist.")
    at = _last_trailer(path, f, size)
    if at is None:
        raise SessionFileError(f"{path} is truncated or damaged: it holds no complete save.")
    trailer = _read_at(path, f, at, TRAILER_BYTES)
    offset, length = struct.unpack_from("<QQ", trailer, 8)
    record = _read_at(path, f, offset, length)
    if hashlib.sha256(record).digest() != trailer[24:56]:
        raise SessionFileError(f"{path} is damaged: its last save's record does not match its checksum.")
    header, index = _parse_record(path, record, offset)
    return Commit(header, index, at + TRAILER_BYTES, trailer, size - at - TRAILER_BYTES)


def read_blocks(path: str | Path, f: BinaryIO, commit: Commit) -> dict[str, list[bytes]]:
    """Every block the commit's index names, each checked against its checksum."""
    blocks: dict[str, list[bytes]] = {}
    for role, spans in commit.index.items():
        blocks[role] = []
        for number, span in enumerate(spans, 1):
            payload = _read_at(path, f, span.offset, span.length)
            if block_digest(payload) != span.digest:
                raise SessionFileError(f"{path} is damaged: block {number} of its {role} cache does not match "
                                       "its checksum.")
            blocks[role].append(payload)
    return blocks


def last_trailer(path: str | Path, f: BinaryIO | int, size: int) -> int | None:
    """Where the last trailer of the file open as ``f`` (a file or a descriptor) starts, if it has one."""
    return _last_trailer(path, f, size)


def _last_trailer(path: str | Path, f: BinaryIO | int, size: int) -> int | None:
    """The offset of the last trailer whose own check passes (and whose record lies before it), if any."""
    for at in _candidates(path, f, size):
        trailer = _read_at(path, f, at, TRAILER_BYTES)
        body, check = trailer[:56], trailer[56:]
        if hashlib.blake2b(body, digest_size=8).digest() != check:
            continue
        offset, length = struct.unpack_from("<QQ", body, 8)
        if offset >= HEAD_BYTES and offset + length == at:
            return at
    return None


def _candidates(path: str | Path, f: BinaryIO | int, size: int) -> Iterator[int]:
    """Offsets of TRAILER_MAGIC where a whole trailer fits, last first (read backwards in chunks)."""
    end = size - TRAILER_BYTES + len(TRAILER_MAGIC)  # a magic starting later leaves no room for its trailer
    while end > HEAD_BYTES:
        start = max(HEAD_BYTES, end - _SCAN_CHUNK)
        data = _read_at(path, f, start, end - start)
        hit = data.rfind(TRAILER_MAGIC)
        while hit >= 0:
            yield start + hit
            hit = data.rfind(TRAILER_MAGIC, 0, hit + len(TRAILER_MAGIC) - 1)
        end = start + len(TRAILER_MAGIC) - 1  # a magic across the chunk boundary is found in the next chunk
        if start == HEAD_BYTES:
            return


def _parse_record(path: str | Path, record: bytes,
                  record_offset: int) -> tuple[dict[str, object], dict[str, tuple[Span, ...]]]:
    reader = _Reader(path, record)
    length = reader.unpack("<I")[0]
    if length > MAX_RECORD_HEADER:
        raise SessionFileError(f"{path} is corrupted: its header declares {length:,} bytes, over the limit.")
    header = parse_json(path, reader.take(length))
    index: dict[str, tuple[Span, ...]] = {}
    for _ in range(reader.unpack("<B")[0]):
        role_number, count = reader.unpack("<BI")
        if role_number >= len(ROLES) or ROLES[role_number] in index:
            raise SessionFileError(f"{path} is corrupted: its index names cache role {role_number}.")
        role = ROLES[role_number]
        spans = tuple(Span(*_BLOCK_ENTRY.unpack(reader.take(_BLOCK_ENTRY.size))) for _ in range(count))
        for number, span in enumerate(spans, 1):
            if span.offset < HEAD_BYTES or span.offset + span.length > record_offset:
                raise SessionFileError(f"{path} is corrupted: its index points block {number} of its {role} cache "
                                       f"at bytes {span.offset:,}-{span.offset + span.length:,}, past the end of "
                                       f"what was saved before it ({record_offset:,}).")
        index[role] = spans
    if not reader.done:
        raise SessionFileError(f"{path} is corrupted: its last save's record is longer than its index.")
    return header, index


class _Reader:
    """Fixed-size fields off a record's bytes; running past the end is a ``SessionFileError``."""

    def __init__(self, path: str | Path, data: bytes) -> None:
        self.path, self.data, self.at = path, data, 0

    @property
    def done(self) -> bool:
        return self.at == len(self.data)

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise SessionFileError(f"{self.path} is corrupted: its last save's record ends too early.")
        self.at += n
        return self.data[self.at - n:self.at]

    def unpack(self, layout: str) -> tuple[int, ...]:
        """The next fields, of a ``layout`` of integers only."""
        return struct.unpack(layout, self.take(struct.calcsize(layout)))


def _read_at(path: str | Path, f: BinaryIO | int, offset: int, n: int) -> bytes:
    data = os.pread(f if isinstance(f, int) else f.fileno(), n, offset)
    if len(data) != n:  # a size check passed: the file shrank while being read
        raise SessionFileError(f"{path} is truncated: it ended while being read.")
    return data


def parse_json(path: str | Path, data: bytes) -> dict[str, object]:
    """A session file's JSON header (any layout), or ``SessionFileError`` saying what is wrong with it."""
    try:
        value: object = json.loads(data.decode("utf-8"), parse_constant=_refuse)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise SessionFileError(f"{path} has a header that is not valid JSON ({error}).") from None
    if not isinstance(value, dict):
        raise SessionFileError(f"{path} has a header that is not a JSON object.")
    return value


def _refuse(name: str) -> NoReturn:
    raise ValueError(f"{name} is not allowed")

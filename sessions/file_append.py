"""Write appending session files (file_layout.py): whole and compact, or one save appended to the last.

``write_whole`` makes a compact file atomically (temporary file, fsync, rename, fsync of the
folder), as formats 1 and 2 were written. ``append_save`` adds one save to a file this
process wrote or read (its ``FileMark``): the new blocks and the record, fsync, then the
trailer, fsync. Until the trailer is down the file's state is the save before; a failure
(a full disk) cuts the file back to that save's end, byte for byte what it was. Blocks are
addressed by key (kv_blocks.py): a block the file already holds is named again, not written.
Pure Python (no MLX).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sessions.disk_sync import sync_to_disk
from sessions.errors import SessionSaveError
from sessions.file_format import (cannot_write_text, fsync_folder, open_session_file, read_start, rewrite_whole_header,
                                  write_error_text)
from sessions.file_layout import (HEAD_BYTES, TRAILER_BYTES, Commit, Span, block_digest, encode_record,
                                  encode_trailer, head, is_appending, last_trailer, read_blocks, read_commit)
from sessions.temp_files import sweep_dead_temps, temp_path

Blocks = Mapping[str, Iterable[tuple[str, bytes | None]]]  # role -> (key, payload or None if the file has it)
WholeBlocks = Mapping[str, Iterable[tuple[str, bytes]]]  # role -> (key, payload): every block of a whole file


@dataclass(frozen=True)
class FileMark:
    """A file as this process last wrote or read it: what the next save may append to."""

    path: str  # the file written (a symlink's target)
    device: int
    inode: int
    end: int  # just past the last trailer
    trailer: bytes  # the file must still end with these bytes at ``end``
    spans: dict[str, Span]  # block key -> where it lies, for the blocks the last save named
    live: int  # bytes the last save needs (the rest is dead space)


def mark_of(path: Path, commit: Commit, keys: dict[str, list[str]], stat: os.stat_result) -> FileMark:
    """The mark of a file just read: ``keys``, role -> the keys of its commit's blocks in order."""
    spans = {key: span for role, spans in commit.index.items() for key, span in zip(keys.get(role, ()), spans)}
    return FileMark(os.path.realpath(path), stat.st_dev, stat.st_ino, commit.end, commit.trailer, spans,
                    commit.live_bytes)


def write_whole(path: Path, header: bytes, blocks: WholeBlocks) -> FileMark:
    """Write a compact file at ``path`` atomically: a crash leaves the previous file (or none)."""
    target = Path(os.path.realpath(path))  # a symlink stays one: its target is written
    sweep_dead_temps(target.parent, also=target.name)
    temp = temp_path(target)
    try:
        with open(temp, "wb") as out:
            out.write(head())
            spans: dict[str, Span] = {}
            index: dict[str, list[Span]] = {}
            for role, items in blocks.items():
                index[role] = []
                for key, payload in items:
                    if key not in spans:  # a block named twice is written once
                        spans[key] = Span(out.tell(), len(payload), block_digest(payload))
                        out.write(payload)
                    index[role].append(spans[key])
            record_at = out.tell()
            record = encode_record(header, index)
            trailer = encode_trailer(record_at, record)
            out.write(record + trailer)
            out.flush()
            sync_to_disk(out.fileno())
            end = out.tell()
        os.replace(temp, target)
    except OSError as error:
        raise SessionSaveError(write_error_text(path, error)) from error
    finally:
        _remove_quietly(temp)
    fsync_folder(target.parent)
    stat = target.stat()
    return FileMark(str(target), stat.st_dev, stat.st_ino, end, trailer, spans, end)


def append_save(path: Path, mark: FileMark, header: bytes, blocks: Blocks) -> FileMark | None:
    """Append one save to the file ``mark`` describes; None when the file is no longer as ``mark`` says
    (replaced, or changed by someone else): the caller writes it whole instead. Temporaries that killed whole
    writes left beside it go too: a chat that only appends would otherwise keep them for good."""
    sweep_dead_temps(Path(mark.path).parent, also=Path(mark.path).name)
    try:
        fd = os.open(mark.path, os.O_RDWR)
    except OSError:
        return None
    try:
        if not _unchanged(fd, mark):
            return None
        if os.fstat(fd).st_size > mark.end:
            os.ftruncate(fd, mark.end)  # what an unfinished save left: never part of a state
        return _append(fd, path, mark, header, blocks)
    finally:
        os.close(fd)


def _append(fd: int, path: Path, mark: FileMark, header: bytes, blocks: Blocks) -> FileMark:
    spans: dict[str, Span] = {}
    index: dict[str, list[Span]] = {}
    new: list[bytes] = []
    at = mark.end
    for role, items in blocks.items():
        index[role] = []
        for key, payload in items:
            if key not in spans:
                if payload is None:
                    spans[key] = mark.spans[key]
                else:
                    spans[key] = Span(at, len(payload), block_digest(payload))
                    new.append(payload)
                    at += len(payload)
            index[role].append(spans[key])
    record = encode_record(header, index)
    trailer = encode_trailer(at, record)
    try:
        _write_at(fd, mark.end, b"".join(new) + record)
        sync_to_disk(fd)  # everything the trailer names is down before the trailer
        _write_at(fd, at + len(record), trailer)
        sync_to_disk(fd)
    except OSError as error:
        _cut_back(fd, mark.end)
        raise SessionSaveError(cannot_write_text(path, error) + " The file still holds its previous save.") \
            from error
    end = at + len(record) + TRAILER_BYTES
    live = HEAD_BYTES + sum(s.length for s in spans.values()) + len(record) + TRAILER_BYTES
    return FileMark(mark.path, mark.device, mark.inode, end, trailer, spans, live)


def _unchanged(fd: int, mark: FileMark) -> bool:
    """The file is the one ``mark`` describes and its last save is still the one ``mark`` knows: bytes after
    it are a torn save, not a complete one another process appended."""
    stat = os.fstat(fd)
    if (stat.st_dev, stat.st_ino) != (mark.device, mark.inode) or stat.st_size < mark.end:
        return False
    if os.pread(fd, TRAILER_BYTES, mark.end - TRAILER_BYTES) != mark.trailer:
        return False
    return stat.st_size == mark.end or last_trailer(mark.path, fd, stat.st_size) == mark.end - TRAILER_BYTES


def _write_at(fd: int, offset: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _cut_back(fd: int, end: int) -> None:
    """Drop a failed save's bytes (cutting needs no space); if even that fails, the trailer rule still holds."""
    try:
        os.ftruncate(fd, end)
        sync_to_disk(fd)
    except OSError:
        pass


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only folder never had the temporary file


def rewrite_header(path: Path, header: bytes) -> None:
    """Give a session file of any layout a new header (a title, the history), its cache data kept as it is:
    an appending file gets one more save naming the same blocks; a whole one is rewritten atomically."""
    with open_session_file(path) as f:
        appending = is_appending(read_start(path, f, os.fstat(f.fileno()).st_size))
    (append_header if appending else rewrite_whole_header)(path, header)


def append_header(path: Path, header: bytes) -> None:
    """One more save of the file at ``path`` with a new header and the same blocks (title, history)."""
    with open_session_file(path) as f:
        stat = os.fstat(f.fileno())
        commit = read_commit(path, f, stat.st_size)
        read_blocks(path, f, commit)  # a damaged file is refused, not saved again as if it were whole
    names = {role: [(f"{role}.{n}", None) for n in range(len(spans))] for role, spans in commit.index.items()}
    keys = {role: [key for key, _ in items] for role, items in names.items()}
    if append_save(path, mark_of(path, commit, keys, stat), header, names) is None:
        raise SessionSaveError(f"Cannot write {path}: it changed while being written. Try again.")

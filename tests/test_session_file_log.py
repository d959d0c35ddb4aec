"""The appending session file (format 3): what a save appends, torn saves, its own damage, compaction, SIGKILL
at every disk call of a save, a full disk mid-append.

A tiny speculative engine plays a chat: turns, a regeneration, an edit, a clear that leaves most blocks
dead (the save compacts), one more turn. Each save must add only the blocks the file lacks, and
every state must load exactly as saved.
"""

from __future__ import annotations

import dataclasses
import os
import random
import resource
import struct
from pathlib import Path

import pytest

from session_file_forms import appending
from session_kill_helper import tiny_engine
from session_log_io import points, run_forked

from mlxcore.params import GenerationParams
from sessions.chat_session import ChatSession
from sessions.errors import SessionFileError, SessionSaveError
from sessions.file_append import FileMark
from sessions.file_format import encode_header
from sessions.file_header import APPENDING_VERSION
from sessions.file_layout import HEAD_BYTES, TRAILER_BYTES, encode_record, encode_trailer
from sessions.file_read import read_contents
from sessions.file_save import COMPACT_AT, write_session_file
from sessions.kv_blocks import state_blocks
from sessions.session_file import saved_caches, session_header
from turn_checks import same_chat

NOTES = " ".join(f"Note {i}: street {i * 7} sold {i * 3 + 11} apples." for i in range(30))
STEPS = ("Hello there, how are you today?", f"{NOTES}\nWhich street sold the most?", "regenerate", "edit",
         "clear", "And the pears?")


def play(session: ChatSession, step: str) -> None:
    if step == "regenerate":
        session.params = dataclasses.replace(session.params, temperature=1.0, seed=5)
        session.regenerate()
    elif step == "edit":
        session.edit_last_user("And the plums?")
    elif step == "clear":
        session.clear()  # the cache keeps the system prompt only: the next save's file is mostly dead space
        session.send("Start again: what is 2 + 2?")
    else:
        session.send(step)


def new_session() -> ChatSession:
    return ChatSession(tiny_engine("paged"), "You are a helpful assistant.", GenerationParams(max_tokens=12))


def new_spans(before: FileMark, after: FileMark) -> set[str]:
    """Keys of the blocks a save wrote: those placed past the file's end before it."""
    return {key for key, span in after.spans.items() if span.offset >= before.end}


# --- what a save appends ----------------------------------------------------------------------------

def test_each_save_appends_only_the_blocks_the_file_lacks_and_loads_as_saved(tmp_path):
    path, session, compactions = tmp_path / "chat.mlxchat", new_session(), []
    for step in STEPS:
        play(session, step)
        before = session.saved_files.get(os.path.realpath(path))
        old = path.read_bytes() if path.exists() else b""
        session.save(path)
        mark = session.saved_files[os.path.realpath(path)]
        data = path.read_bytes()
        assert appending(path) and len(data) == mark.end
        if before is not None and _appended_dead_share(before, mark) < COMPACT_AT:
            assert data.startswith(old), f"{step}: appended, nothing before it rewritten"
            assert new_spans(before, mark) == set(mark.spans) - set(before.spans), \
                f"{step}: written exactly the blocks the file did not hold"
        elif before is not None:
            assert mark.live == len(data), f"{step}: compacted, as appending would leave half the file dead"
            compactions.append(step)
        assert same_chat(ChatSession.load(path, tiny_engine("paged")), session), step
    assert "clear" in compactions, "the clear left most of the file dead"


def _appended_dead_share(before: FileMark, after: FileMark) -> float:
    """The dead share the file would have had, had ``after``'s save been appended to ``before``'s file."""
    new = sum(span.length for key, span in after.spans.items() if key not in before.spans)
    record = after.live - HEAD_BYTES - sum(span.length for span in after.spans.values())
    end = before.end + new + record
    return (end - after.live) / end


def test_a_regeneration_appends_only_from_where_the_reply_changed(tmp_path):
    path, session = tmp_path / "chat.mlxchat", new_session()
    for step in STEPS[:2]:
        play(session, step)
    session.save(path)
    before, kept = session.saved_files[os.path.realpath(path)], session.caches.tokens
    play(session, "regenerate")
    session.save(path)
    after = session.saved_files[os.path.realpath(path)]
    common = next((i for i, (a, b) in enumerate(zip(kept, session.caches.tokens)) if a != b), len(kept))
    first_new_block = common // 16
    written_target = [k for k in new_spans(before, after) if k in {r for r in _keys(session, "target")}]
    assert len(written_target) == len(session.caches.tokens[first_new_block * 16:]) // 16 + \
        bool(len(session.caches.tokens) % 16), "the blocks from the one the reply changed in, no earlier"


def _keys(session: ChatSession, role: str) -> list[str]:
    engine = session.engine
    cut = state_blocks(*engine.cache_state(role, getattr(session.caches, role), session.caches.ids), engine.fingerprint, role)
    return [ref.key for ref in cut.refs]


def test_a_save_to_another_path_writes_it_whole_and_the_first_file_still_appends(tmp_path):
    session = new_session()
    play(session, STEPS[0])
    session.save(tmp_path / "a.mlxchat")
    play(session, STEPS[1])
    session.save(tmp_path / "b.mlxchat")
    mark = session.saved_files[os.path.realpath(tmp_path / "b.mlxchat")]
    assert mark.live == mark.end == (tmp_path / "b.mlxchat").stat().st_size, "whole and compact"
    old = (tmp_path / "a.mlxchat").read_bytes()
    session.save(tmp_path / "a.mlxchat")
    assert (tmp_path / "a.mlxchat").read_bytes().startswith(old), "a.mlxchat is appended to"
    for name in ("a", "b"):
        assert same_chat(ChatSession.load(tmp_path / f"{name}.mlxchat", tiny_engine("paged")), session)


def test_a_file_another_session_replaced_is_written_whole_not_appended_to(tmp_path):
    path, first, second = tmp_path / "chat.mlxchat", new_session(), new_session()
    play(first, STEPS[0])
    first.save(path)
    play(second, "Something else entirely.")
    second.save(path)  # a new file under the same name
    play(first, STEPS[1])
    first.save(path)
    assert same_chat(ChatSession.load(path, tiny_engine("paged")), first)
    assert read_contents(path).commit.live_bytes == path.stat().st_size, "written whole"


def test_a_save_another_process_appended_is_not_taken_for_a_torn_one(tmp_path):
    """Two sessions on one file without the lock (Python API): the second to save knows the file only up to
    the first's save, so it writes the file whole (its own state) rather than cut a complete save away."""
    path, session = tmp_path / "chat.mlxchat", new_session()
    play(session, STEPS[0])
    session.save(path)
    other = ChatSession.load(path, tiny_engine("paged"))
    play(other, "Something else entirely.")
    other.save(path)  # appended after what ``session`` knows
    play(session, STEPS[1])
    session.save(path)
    assert same_chat(ChatSession.load(path, tiny_engine("paged")), session)
    assert read_contents(path).commit.live_bytes == path.stat().st_size, "written whole, not appended"


def test_exporting_an_earlier_mlxchats_chat_file_writes_the_compact_layout(tmp_path):
    """A whole file of format 1 left in the store's folder by an earlier mlxchat: `sessions export` writes it
    compact, in format 3, the same chat."""
    from session_file_forms import save_whole
    from sessions.store import SessionStore
    session = new_session()
    play(session, STEPS[0])
    (tmp_path / "sessions").mkdir()
    save_whole(session, tmp_path / "sessions" / "old-chat.mlxchat")
    store = SessionStore(tmp_path / "sessions")
    store.export_file("old-chat", tmp_path / "out.mlxchat")
    store.close()
    assert appending(tmp_path / "out.mlxchat")
    assert read_contents(tmp_path / "out.mlxchat").commit.live_bytes == (tmp_path / "out.mlxchat").stat().st_size
    assert same_chat(ChatSession.load(tmp_path / "out.mlxchat", tiny_engine("paged")), session)


# --- torn saves and the layout's own damage -------------------------------------------------------------

@pytest.fixture(scope="module")
def two_saves(tmp_path_factory) -> tuple[bytes, int, ChatSession, ChatSession]:
    """(bytes of a file of two saves, the end of the first, a copy of the chat at the first, at the second)."""
    path = tmp_path_factory.mktemp("two") / "chat.mlxchat"
    session = new_session()
    play(session, STEPS[0])
    session.save(path)
    first_end, first = path.stat().st_size, ChatSession.load(path, tiny_engine("paged"))
    play(session, STEPS[1])
    session.save(path)
    return path.read_bytes(), first_end, first, session


@pytest.mark.parametrize("keep", [1, 100, 0.5, -TRAILER_BYTES, -TRAILER_BYTES + 8, -9, -1])
def test_a_torn_save_opens_at_the_save_before_and_says_so(two_saves, tmp_path, keep):
    data, first_end, first, _ = two_saves
    second = len(data) - first_end  # bytes of the second save
    cut = first_end + (int(second * keep) if isinstance(keep, float) else keep % second)
    path = tmp_path / "torn.mlxchat"
    path.write_bytes(data[:cut])
    opened = ChatSession.load(path, tiny_engine("paged"))
    assert same_chat(opened, first)
    assert f"did not finish ({cut - first_end:,} bytes)" in opened.restore_note
    assert "last complete save" in opened.restore_note
    play(opened, STEPS[1])  # the next save drops the torn bytes and appends
    opened.save(path)
    assert path.read_bytes()[:first_end] == data[:first_end]
    assert same_chat(ChatSession.load(path, tiny_engine("paged")), opened)


def assert_refused(path: Path, match: str) -> None:
    before = path.read_bytes()
    with pytest.raises(SessionFileError, match=match):
        ChatSession.load(path, tiny_engine("paged"))
    assert path.read_bytes() == before, "a refused file is left as it was"


@pytest.mark.parametrize("keep", [32, 40, -TRAILER_BYTES, -1])
def test_a_file_with_no_complete_save_is_refused(two_saves, tmp_path, keep):
    data, first_end, _, _ = two_saves
    path = tmp_path / "t.mlxchat"
    path.write_bytes(data[: keep % first_end])  # a torn first save: a torn trailer, or less
    assert_refused(path, "holds no complete save|truncated")


def test_a_block_that_fails_its_checksum_is_refused(two_saves, tmp_path):
    data, _, _, _ = two_saves
    path = tmp_path / "b.mlxchat"
    at = 32 + 200  # inside the first block, which every save names
    path.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])
    assert_refused(path, "block 1 of its target cache does not match its checksum")


def test_damage_in_the_last_record_is_refused_not_taken_for_a_torn_save(two_saves, tmp_path):
    data, _, _, _ = two_saves
    path = tmp_path / "r.mlxchat"
    at = len(data) - TRAILER_BYTES - 10  # the last record's index; its trailer is whole
    path.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])
    assert_refused(path, "record does not match its checksum")


def test_an_index_pointing_past_the_end_is_refused(two_saves, tmp_path):
    data, _, _, _ = two_saves
    source = tmp_path / "s.mlxchat"
    source.write_bytes(data)
    commit = read_contents(source).commit
    record_at = struct.unpack_from("<Q", commit.trailer, 8)[0]
    index = {role: list(spans) for role, spans in commit.index.items()}
    index["draft"][-1] = dataclasses.replace(index["draft"][-1], offset=record_at + 100)
    record = encode_record(encode_header(commit.header), index)
    path = tmp_path / "p.mlxchat"
    path.write_bytes(data[:record_at] + record + encode_trailer(record_at, record))
    assert_refused(path, "points block .* of its draft cache at bytes .* past the end")


def test_a_header_version_its_layout_never_holds_is_refused(two_saves, tmp_path):
    from session_file_forms import resealed, save_whole
    whole = tmp_path / "whole.mlxchat"
    save_whole(two_saves[3], whole)
    assert_refused(resealed(tmp_path, whole.read_bytes(), lambda h: h.update(version=3)),
                   "newer mlxchat, or is damaged: it is a whole file with session format 3")
    assert_refused(resealed(tmp_path, two_saves[0], lambda h: h.update(version=1)),
                   "header says session format 1, its layout is format 3")


def test_a_newer_layout_is_refused_as_newer(two_saves, tmp_path):
    from sessions.file_layout import HEAD_BYTES, head
    data = two_saves[0]
    path = tmp_path / "n.mlxchat"
    path.write_bytes(head(4) + data[HEAD_BYTES:])
    assert_refused(path, "saved by a newer mlxchat .*layout 4")


# --- SIGKILL during saves -----------------------------------------------------------------------------

def test_sigkill_at_every_disk_call_of_a_save_leaves_exactly_the_state_before_or_after(tmp_path):
    """Each save of the played chat is run in forked children killed before each of its disk calls, half-way
    through each write, and at random moments; the file must then open as the state before or after."""
    path, session, rng = tmp_path / "chat.mlxchat", new_session(), random.Random(33)
    outcomes, reference = {"before": 0, "after": 0}, None
    for step in STEPS:
        play(session, step)
        header, cuts = _cut(session)
        before = path.read_bytes() if path.exists() else None
        mark = session.saved_files.get(os.path.realpath(path))
        def save(header=header, cuts=cuts, before=before, mark=mark):
            return write_session_file(path, header, cuts, _restored(path, before, mark))
        _, events = run_forked(save)
        plan = [{"kill_at": p} for p in points(events)] + [{"after_s": rng.uniform(0, 0.004)} for _ in range(2)]
        for kill in plan:
            _restored(path, before, mark)
            run_forked(save, **kill)
            outcomes[_which(path, reference, session)] += 1
        _restored(path, before, mark)
        session.saved_files[os.path.realpath(path)] = save()
        reference = ChatSession.load(path, tiny_engine("paged"))
        assert same_chat(reference, session)
    assert sum(outcomes.values()) >= 50 and min(outcomes.values()) > 0, outcomes


def _cut(session: ChatSession):
    engine = session.engine
    fingerprints = {"target": engine.fingerprint, "draft": engine.draft_fingerprint}
    cuts = {role: state_blocks(*engine.cache_state(role, cache, session.caches.ids), fingerprints[role], role)
            for role, cache in saved_caches(session).items()}
    for cut in cuts.values():
        cut.encode_all()  # no MLX in the forked children
    created = session.created_at = session.created_at or 1.0e9
    header = session_header(session, {role: (cut.geometry, cut.meta) for role, cut in cuts.items()}, created)
    return encode_header(header | {"version": APPENDING_VERSION}), cuts


def _restored(path: Path, data: bytes | None, mark: FileMark | None) -> FileMark | None:
    """Put the file back as it was before the save (a killed child may have renamed a new one in); its mark."""
    for temp in path.parent.glob(f".{path.name}.*.tmp"):
        temp.unlink()  # what killed whole writes left
    if data is None:
        path.unlink(missing_ok=True)
        return None
    if path.read_bytes() != data:
        path.write_bytes(data)
    stat = path.stat()
    return dataclasses.replace(mark, device=stat.st_dev, inode=stat.st_ino) if mark else None


def _which(path: Path, before: ChatSession | None, after: ChatSession) -> str:
    if before is None and not path.exists():
        return "before"  # the first save was killed before its rename
    opened = ChatSession.load(path, tiny_engine("paged"))
    if same_chat(opened, after):
        return "after"
    assert before is not None and same_chat(opened, before), "neither the state before nor the one after"
    return "before"


# --- a full disk mid-append ----------------------------------------------------------------------------

@pytest.mark.parametrize("room", [0, 0.5, -1])
def test_a_full_disk_during_an_append_leaves_the_file_byte_for_byte(two_saves, tmp_path, room):
    """RLIMIT_FSIZE caps the file at its size plus ``room`` of what the save needs (-1: all but its trailer's
    last byte): the save fails, says what failed, and the file is what it was."""
    data, _, _, session = two_saves
    path = tmp_path / "chat.mlxchat"
    path.write_bytes(data)
    grown = ChatSession.load(path, tiny_engine("paged"))
    mark = grown.saved_files[os.path.realpath(path)]
    play(grown, "And the pears?")
    header, cuts = _cut(grown)
    need = _bytes_needed(tmp_path, header, cuts, mark, data)
    limit = len(data) + (need - 1 if room == -1 else int(need * room))
    failure = tmp_path / "failure.txt"

    def save() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            write_session_file(path, header, cuts, mark)
        except SessionSaveError as error:
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            failure.write_text(str(error))

    run_forked(save)
    assert path.read_bytes() == data, "the file is byte for byte what it was"
    assert "File too large" in failure.read_text() and "still holds its previous save" in failure.read_text()
    assert same_chat(ChatSession.load(path, tiny_engine("paged")), session)


def _bytes_needed(tmp_path: Path, header: bytes, cuts, mark: FileMark, data: bytes) -> int:
    trial = tmp_path / "trial.mlxchat"
    trial.write_bytes(data)
    stat = trial.stat()
    after = write_session_file(trial, header, cuts, dataclasses.replace(mark, path=str(trial), device=stat.st_dev,
                                                                        inode=stat.st_ino))
    assert after.end > len(data), "the trial appended"
    return after.end - len(data)


# --- the bench's measures on tiny models ------------------------------------------------------------------

def test_a_file_with_dead_space_and_its_compact_copy_open_alike(tmp_path):
    from bench.session_restore import measure_appended_restore
    from bench.session_file_write import open_dead_vs_compact
    row = open_dead_vs_compact(tiny_engine("paged"), tmp_path, 1, min_tokens=300)
    assert 0.2 < row["dead_share"] < COMPACT_AT and row["compact_bytes"] < row["dead_bytes"] and row["value"] > 0
    restore = measure_appended_restore(tiny_engine("paged", draft=False), 1, tmp_path / "a.mlxchat", min_tokens=1500)
    assert restore["saves"] > 1 and restore["value"] > 0  # a timing: the bench judges it, not a test


def test_an_appending_save_sweeps_what_a_killed_compaction_left(tmp_path):
    """A compaction killed before its rename leaves ``.NAME.PID.tmp``; before, only the next whole write swept it,
    and a chat that only appends after that kept it for good."""
    from sessions.temp_files import QUIET_SECONDS
    session, path = new_session(), tmp_path / "chat.mlxchat"
    session.send(STEPS[0])
    session.save(path)
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # a pid no process has now: the writer was killed
    orphan = path.with_name(f".{path.name}.{dead}.tmp")
    orphan.write_bytes(b"half a compaction")
    old = orphan.stat().st_mtime - QUIET_SECONDS - 5
    os.utime(orphan, (old, old))
    mark = session.saved_files[os.path.realpath(path)]
    session.send("And the pears?")
    session.save(path)
    assert session.saved_files[os.path.realpath(path)].end > mark.end, "the save appended"
    assert session.saved_files[os.path.realpath(path)].inode == mark.inode, "the file was not rewritten"
    assert not orphan.exists(), "the orphan was swept"

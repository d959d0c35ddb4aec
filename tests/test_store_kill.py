"""SIGKILL during incremental autosaves into the session store: the store always opens, with the last good state.

tests/store_kill_helper.py plays a chat through turns, a regeneration and an edit, and for
each save forks children that run the store's disk code (block files, index commit, GC)
and are killed at I/O events and at random moments. After every kill this process opens
the store as a user's next mlxchat would and compares the chat with the reference files
of the state before and after that save: it must be exactly one of them, with every
cache block there. The last test kills whole processes running ``SessionStore.save``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import store_gc_helper as gc_helper
from session_kill_helper import tiny_engine

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
from sessions.block_files import BlockFiles
from sessions.chat_session import ChatSession
from sessions.store import SessionStore
from sessions.store_index import StoreIndex
from turn_checks import same_state, same_chat

ROOT = Path(__file__).resolve().parent.parent
HELPER = Path(__file__).with_name("store_kill_helper.py")
WAIT_S = 120  # only a bound for a helper that hangs
EVENT_POINTS, TIME_POINTS = 12, 6  # kill points per save (5 saves)


class Helper:
    def __init__(self, *args: Path) -> None:
        self.process = subprocess.Popen([sys.executable, str(HELPER), *map(str, args)], cwd=ROOT, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def answer(self) -> dict:
        line = self.process.stdout.readline()
        assert line, f"the helper ended (exit status {self.process.wait(WAIT_S)})"
        return json.loads(line)

    def ask(self, do: str, **fields: object) -> dict:
        self.process.stdin.write(json.dumps({"do": do, **fields}) + "\n")
        self.process.stdin.flush()
        return self.answer()


def stored_state(root: Path, chat: str, expected: Path, state: int, engine) -> str:
    """Open the store as the next mlxchat would: "before" or "after" the save of ``state``, else fail."""
    store = SessionStore(root)
    try:
        listed = [info.id for info in store.list()]
        if not listed and state == 0:
            return "before"  # the first save was killed before its commit: no chat yet
        assert listed == [chat]
        session = store.load(chat, engine)
        assert session.restore_note is None, f"a block is missing or damaged: {session.restore_note}"
        for name, n in (("after", state), ("before", state - 1)):
            if n >= 0 and same_chat(session, ChatSession.load(expected / f"{n}.mlxchat", engine)):
                return name
        raise AssertionError(f"the stored chat is neither state {state - 1} nor state {state}")
    finally:
        store.close()


@pytest.mark.slow
def test_sigkill_at_random_points_of_incremental_autosaves_leaves_the_last_good_state(tmp_path):
    root, expected = tmp_path / "sessions", tmp_path / "expected"
    expected.mkdir()
    helper, engine, rng = Helper(root, expected), tiny_engine("paged"), random.Random(20)
    outcomes: dict[str, int] = {}
    try:
        line = helper.answer()
        while "done" not in line:
            state, chat = line["state"], line["chat"]
            trace = helper.ask("measure")
            events = rng.sample(range(1, trace["events"] + 1), min(EVENT_POINTS, trace["events"]))
            points = [{"event": k} for k in events] + \
                     [{"after": rng.uniform(0, trace["seconds"])} for _ in range(TIME_POINTS)]
            for point in points:
                helper.ask("kill", **point)
                outcome = stored_state(root, chat, expected, state, engine)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
            line = helper.ask("next")
    finally:
        helper.process.kill()
        helper.process.wait(WAIT_S)
    assert sum(outcomes.values()) >= 50 and outcomes.keys() == {"before", "after"}, outcomes
    store = SessionStore(root)
    assert store.collect_garbage() is not None
    assert set(BlockFiles(root).keys()) == StoreIndex(root).referenced(), "GC leaves exactly the blocks in use"
    assert same_chat(store.load(chat, engine), ChatSession.load(expected / f"{state}.mlxchat", engine))


@pytest.mark.slow
def test_sigkill_of_a_process_saving_over_and_over_leaves_a_store_that_opens(tmp_path):
    """Whole processes (MLX and all) running ``SessionStore.save`` on a growing chat, killed at random moments."""
    rng, engine = random.Random(3), gc_helper.engine()
    for seed in range(3):
        root = tmp_path / f"sessions-{seed}"
        saver = subprocess.Popen([sys.executable, str(Path(__file__).with_name("store_gc_helper.py")), "grow",
                                  str(root), str(seed), "150"], cwd=ROOT, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            saver.stdin.write("go\n")
            saver.stdin.flush()
            assert saver.stdout.readline().startswith("saved 0 "), "the saver made its first save"
            time.sleep(rng.uniform(0.0, 1.0))
        finally:
            os.kill(saver.pid, signal.SIGKILL)
            saver.wait(WAIT_S)
        done = ["saved 0"] + [line for line in saver.stdout.read().splitlines() if line.endswith(" missing 0")]
        last = int(done[-1].split()[1])  # the last save it reported done
        store = SessionStore(root)
        [info] = store.list()
        session = store.load(info.id, engine)
        assert session.restore_note is None, session.restore_note
        assert any(session.history == (want := gc_helper.chat_state(engine, seed, n)).history
                   and same_state(session.caches, want.caches) for n in (last, last + 1))
        store.close()

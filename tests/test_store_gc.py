"""Deletes and garbage collection in one process while another saves: no block a chat holds is ever removed.

Two tests/store_gc_helper.py processes share one store. One grows a chat save after save
(each save drops its old tail block and collects it). The other saves, for each of those
states, the *next* one as a chat of its own and deletes it at once, collecting garbage
twice: the blocks the growing chat's next save will find on disk are being deleted while
it looks for them. After every step each process checks that every block a chat refers to
is on disk; at the end the growing chat must open with every block of its last state, and
the store must hold exactly the blocks its chats refer to.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import store_gc_helper as gc_helper

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from sessions.block_files import BlockFiles
from sessions.store import SessionStore
from sessions.store_index import StoreIndex

ROOT = Path(__file__).resolve().parent.parent
HELPER = Path(__file__).with_name("store_gc_helper.py")
STATES = 60
WAIT_S = 300  # only a bound for a helper that hangs


def start(action: str, root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HELPER), action, str(root), "7", str(STATES)], cwd=ROOT,
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


@pytest.mark.slow
def test_delete_and_gc_in_another_process_never_remove_a_block_a_chat_holds(tmp_path):
    root = tmp_path / "sessions"
    grower, shadow = start("grow", root), start("shadow", root)
    for helper in (grower, shadow):  # both loaded: go at once
        helper.stdin.write("go\n")
        helper.stdin.flush()
    outputs = [helper.communicate(timeout=WAIT_S)[0].splitlines() for helper in (grower, shadow)]
    assert [helper.returncode for helper in (grower, shadow)] == [0, 0], outputs
    assert [len(lines) for lines in outputs] == [STATES, STATES]
    assert all(line.endswith(" missing 0") for lines in outputs for line in lines), \
        "at every step, every block a chat refers to was on disk"

    store = SessionStore(root)
    [info] = store.list()  # every shadow chat was deleted
    engine = gc_helper.engine()
    session = store.load(info.id, engine)
    assert session.restore_note is None, f"a block the chat holds is gone: {session.restore_note}"
    want = gc_helper.chat_state(engine, 7, STATES - 1)
    (got, _), (expected, _) = (s.caches.target.state_dict(s.caches.ids) for s in (session, want))
    assert all(mx.array_equal(got[name], expected[name]).item() for name in expected)
    store.close()
    assert store.collect_garbage() is not None
    assert set(BlockFiles(root).keys()) == StoreIndex(root).referenced(), "exactly the blocks in use are left"

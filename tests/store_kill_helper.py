"""Autosaves of one chat into a session store, killed with SIGKILL where tests/test_store_kill.py says.

``python tests/store_kill_helper.py STORE EXPECTED`` plays a chat on a tiny speculative
engine through ``STATES`` (turns that add blocks, a regeneration and an edit that drop
some). For each state it writes the state as a session file ``EXPECTED/<n>.mlxchat``
(the reference), cuts the session into its blocks (MLX work, done here), keeps a copy
of the store as it was before the save, prints ``{"state": n, "chat": ID}`` and answers
commands, one JSON line each:

- ``{"do": "measure"}``: run the save to the end in a child; answer the I/O events it
  went through and its seconds (the store is put back as it was afterwards).
- ``{"do": "kill", "event": K}`` / ``{"do": "kill", "after": SECONDS}``: put the store
  back as it was before this save, fork a child that runs the save (``SessionStore._write``:
  block files, index commit, GC), and SIGKILL it as it reaches its K-th I/O event
  (an audit event: open, rename, remove, mkdir, flock, sqlite3.connect) or after SECONDS.
  Answers whether it was killed before it ended.
- ``{"do": "next"}``: run the save here, to the end, and go on to the next state.

The forked child runs no MLX (the blocks were encoded before the fork), only the
store's own disk code: that is where a kill can leave something half written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from session_kill_helper import tiny_engine  # noqa: E402  (imports mlxcore before mlx)
from mlxcore.params import GenerationParams  # noqa: E402
from sessions.chat_session import ChatSession  # noqa: E402
from sessions.store import SessionStore  # noqa: E402
from sessions.store_chat import ChatCut, cut_chat  # noqa: E402

EVENTS = {"open", "os.rename", "os.remove", "os.mkdir", "fcntl.flock", "sqlite3.connect"}
NOTES = " ".join(f"Note {i}: street {i * 7} sold {i * 3 + 11} apples." for i in range(40))
STATES = ("Hello there, how are you today?", f"{NOTES}\nWhich street sold the most?", "regenerate",
          "And the pears?", "edit")


def play(session: ChatSession, step: str) -> None:
    if step == "regenerate":
        session.params = dataclasses.replace(session.params, temperature=1.0, seed=5)
        session.regenerate()
    elif step == "edit":
        session.edit_last_user("And the plums?")
    else:
        session.send(step)


def run_save(store_root: Path, chat: str, cut: ChatCut, kill_at: int | None = None,
             trace: Path | None = None) -> None:
    """In a forked child: the disk half of one save, killed at its ``kill_at``-th I/O event."""
    seen: list[tuple[str, float]] = []
    start = time.perf_counter()

    def hook(event: str, args: tuple) -> None:
        if event in EVENTS:
            seen.append((event, time.perf_counter() - start))
            if len(seen) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    store = SessionStore(store_root)
    store._write(chat, cut)  # what SessionStore.save does once the session is cut (the MLX half)
    if trace is not None:
        trace.write_text(json.dumps({"events": len(seen), "seconds": time.perf_counter() - start}))
    os._exit(0)


def in_child(store_root: Path, chat: str, cut: ChatCut, kill_at: int | None = None, after: float | None = None,
             trace: Path | None = None) -> bool:
    """Run ``run_save`` in a forked child; True when it was killed before it ended."""
    pid = os.fork()
    if pid == 0:
        try:
            run_save(store_root, chat, cut, kill_at, trace)
        except BaseException:
            traceback.print_exc()
        os._exit(1)  # a failure in the save itself shows as exit status 1
    if after is not None:
        time.sleep(after)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
        raise RuntimeError("the save failed in the child")
    return os.WIFSIGNALED(status)


def copy_folder(source: Path, target: Path) -> None:
    """Make ``target`` a copy of ``source`` (nothing, when there is no ``source``)."""
    shutil.rmtree(target, ignore_errors=True)
    if source.exists():
        shutil.copytree(source, target)


def main(store_root: Path, expected: Path) -> None:
    engine = tiny_engine("paged")
    session = ChatSession(engine, "You are a helpful assistant.", GenerationParams(max_tokens=12))
    snapshot = store_root.with_name(store_root.name + ".before")
    chat = "20250101-000000-kill"  # the chat locks are not what is tested here: nobody takes them
    for n, step in enumerate(STATES):
        play(session, step)
        session.save(expected / f"{n}.mlxchat")
        cut = cut_chat(session, session.created_at or time.time())
        cut.encode_all()  # no MLX after the fork
        session.created_at = cut.header["created"]
        copy_folder(store_root, snapshot)  # the store as it was before this save
        print(json.dumps({"state": n, "chat": chat}), flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            copy_folder(snapshot, store_root)
            if command["do"] == "next":
                SessionStore(store_root)._write(chat, cut)
                break
            if command["do"] == "measure":
                trace = expected / "trace.json"
                in_child(store_root, chat, cut, trace=trace)
                answer = json.loads(trace.read_text())
            else:
                answer = {"killed": in_child(store_root, chat, cut, command.get("event"), command.get("after"))}
            print(json.dumps(answer), flush=True)
    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

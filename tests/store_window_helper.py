"""One stand-in mlxchat window on a session store, driven over stdin/stdout by tests/test_store_two_windows.py.

``python tests/store_window_helper.py`` prints ``{"ready": PID}``, then answers each
JSON command line with one JSON line:

- ``{"do": "use", "root": DIR, "same_ids": B}``: leave the store in use (releasing
  its chat, as a window that quits does) and open ``SessionStore(DIR)``. With
  ``same_ids``, every window proposes the same new ids in the same order (one fixed
  second, then a counter), so each new id is raced for.
- ``{"do": "new", "text": T}``: start a chat with the turn T and save it, as autosave does.
- ``{"do": "open", "chat": ID}``: open a stored chat.
- ``{"do": "say", "text": T}``: add the turn T to the open chat and save it.
- ``{"do": "rm" | "rename", "chat": ID, "title": T}``, ``{"do": "ls"}``: the store's own calls.
- ``{"do": "new-many", "count": N, "tag": T}``: N new chats saved one after the other.

Like the TUI's engine host, it holds one open chat and lets the previous one go when
it opens or starts another. Errors come back as ``{"error": TYPE, "message": TEXT}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import mlxcore  # noqa: E402,F401  (optimized BLAS before mlx)
from mlxcore.engine import Engine, KVConfig  # noqa: E402
from mlxcore.errors import MlxchatError  # noqa: E402
from sessions import store as store_module  # noqa: E402
from sessions.chat_session import ChatSession  # noqa: E402
from sessions.messages import Message  # noqa: E402
from sessions.store import SessionStore  # noqa: E402
from tiny_models import tiny_qwen3  # noqa: E402

_fresh_id = store_module._fresh_id


class Window:
    def __init__(self) -> None:
        # No tokenizer: these chats get their turns without generating (the store is what is tested).
        self.engine = Engine(tiny_qwen3(0), fingerprint="tiny", kv=KVConfig("standard"))
        self.store: SessionStore | None = None
        self.session: ChatSession | None = None

    def use(self, root: str, same_ids: bool = False) -> dict:
        if self.store is not None:
            self.store.close()
        self.store, self.session = SessionStore(Path(root)), None
        store_module._fresh_id = _same_ids() if same_ids else _fresh_id
        return {}

    def new(self, text: str) -> dict:
        self._switch(ChatSession(self.engine))
        return self.say(text)

    def open(self, chat: str) -> dict:
        session = self.store.load(chat, self.engine)  # refused while another window holds it
        self._switch(session)
        return {"id": chat, "turns": _turns(session)}

    def say(self, text: str) -> dict:
        self.session.messages += [Message("user", text), Message("assistant", f"Noted: {text}")]
        info = self.store.save(self.session)
        return {"id": info.id, "turns": _turns(self.session)}

    def rm(self, chat: str) -> dict:
        self.store.delete(chat)
        if self.session is not None and self.session.store_id == chat:
            self.session = None
        return {}

    def rename(self, chat: str, title: str) -> dict:
        return {"title": self.store.rename(chat, title).title}

    def ls(self) -> dict:
        return {"chats": [{"id": i.id, "messages": i.messages, "open_elsewhere": i.open_elsewhere}
                          for i in self.store.list()]}

    def new_many(self, count: int, tag: str) -> dict:
        return {"ids": [self.new(f"{tag} {n}")["id"] for n in range(count)]}

    def _switch(self, session: ChatSession) -> None:
        old = self.session
        if old is not None and old.store_id and old.store_id != session.store_id:
            self.store.release(old.store_id)
        self.session = session


def _turns(session: ChatSession) -> list[str]:
    return [m.content for m in session.messages if m.role == "user"]


def _same_ids():
    count = iter(range(1 << 16))
    return lambda: f"20250101-000000-{next(count):04x}"


def main() -> None:
    window = Window()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        action = getattr(window, command.pop("do").replace("-", "_"))
        try:
            answer = action(**command)
        except MlxchatError as error:
            answer = {"error": type(error).__name__, "message": str(error)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()

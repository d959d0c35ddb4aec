"""The engine host: owns the Engine, the open chats and the session store; serves the UI's commands.

It runs on one thread (of the engine's child process), so every MLX call happens
on the thread that made the model. Its loop takes the UI's commands one at a
time and, while any chat has a reply in progress, runs a step of the batching
scheduler between them (replies.py). Each command goes to the part that serves it.
"""

from __future__ import annotations

from app.engine_host import protocol as p
from app.engine_host.autosave import Autosave
from app.engine_host.channel import Channel
from app.engine_host.chat_commands import ChatCommands
from app.engine_host.chats import Chats
from app.engine_host.failure_text import failure_event
from app.engine_host.inbox import Inbox
from app.engine_host.model_holder import ModelHolder
from app.engine_host.opening import Opening
from app.engine_host.publisher import Publisher
from app.engine_host.replies import Replies
from app.engine_host.store_holder import StoreHolder
from app.engine_host.store_jobs import StoreJobs
from app.engine_host.sync_reply import SyncReply
from app.engine_host.tools import ToolOffer
from mlxcore import MlxchatError


class EngineServer:
    """Handles the UI's commands; replies stream as batched chunks, every chat's on one scheduler."""

    def __init__(self, channel: Channel) -> None:
        send = self.send = channel.send
        self.inbox = Inbox(channel)
        self.store = StoreHolder()
        self.chats = Chats(self.store)
        self.model = ModelHolder(send)
        self.autosave = Autosave(send, self.chats, self.store)
        self.publisher = Publisher(send, self.chats, self.model, self.autosave)
        self.tools = ToolOffer(send)
        sync = SyncReply(send, self.inbox, self.model, self.autosave, self.publisher, self.tools)
        self.replies = Replies(send, self.chats, self.model, self.autosave, self.publisher, self.tools, sync)
        self.store_jobs = StoreJobs(send, self.store, self.chats, self.model, self.publisher)
        self.opening = Opening(send, self.model, self.chats, self.store_jobs, self.autosave, self.publisher)
        self.chat_commands = ChatCommands(send, self.chats, self.model, self.autosave, self.publisher)

    def serve(self) -> None:
        """Answer commands until Shutdown (or the UI goes away), stepping the replies in progress between them."""
        while True:
            command = self.inbox.next(wait=not self.replies.stepping)
            if isinstance(command, p.Shutdown):
                self._shut_down()
                return
            if command is not None:
                self.handle(command)
            if self.replies.stepping:
                try:
                    self.replies.advance()
                except Exception as error:  # noqa: BLE001  a bug must not take the chats down: report it
                    self.send(failure_event(error, loaded=self.model.opened is not None))

    def _shut_down(self) -> None:
        """Every reply stops and is kept; the chats are saved (a chat whose last save failed is tried once more)."""
        self.replies.stop_every_turn()
        for chat in self.chats.all():
            if chat.save_error is not None:
                self.autosave.save(chat)
        self.store.close()  # other windows may open its chats now
        if self.model.opened is not None:  # the cached prefixes to the KV disk tier (--disk-kv), for next time
            self.model.engine.keep_kv_on_disk()

    def handle(self, command: p.Command) -> None:
        """Run one command; errors become Failure events, never a crash."""
        try:
            self._dispatch(command)
        except Exception as error:  # noqa: BLE001  a bug must not take the chat down: report it and go on
            self.send(failure_event(error, loaded=self.model.opened is not None, command=command))

    def _dispatch(self, command: p.Command) -> None:
        match command:
            case p.Open():
                self.opening.open(command)
            case p.Send():
                self.replies.send_message(command)
            case p.Regenerate():
                self.replies.regenerate(command)
            case p.EditLast():
                self.replies.edit_last(command)
            case p.ToolResults():
                self.replies.tool_results(command)
            case p.Stop():
                self.replies.stop()
            case p.Pick():
                self.replies.pick(command)
            case p.Configure():
                self.chat_commands.configure(command)
            case p.Chat():
                self.chat_commands.chat(command)
            case p.OpenSession():
                self.store_jobs.open_session(command)
            case p.ManageSession():
                self.store_jobs.manage(command)
            case p.ListSessions():
                self.store_jobs.list_sessions(command)
            case p.Tools():
                self.tools.set(command)
            case p.Shutdown():
                pass  # the loop ends on it (serve)
            case _:
                raise MlxchatError(f"unknown command {type(command).__name__}")

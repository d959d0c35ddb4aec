"""The chat App: shows what the engine host reports, sends it what the user asks for."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App, SystemCommand
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import Screen

from app.engine_host import protocol as p
from app.tui.actions import ChatActions
from app.tui.chat_screen import ChatScreen
from app.tui.commands import ACTIONS
from app.tui.engine_client import EngineClient
from app.tui.engine_recovery import EngineRecovery
from app.tui.gc_pauses import CollectorHold
from app.tui.screens.dialogs import ConfirmDialog, ErrorDialog
from app.tui.screens.download import DownloadScreen
from app.tui.tool_turns import ToolTurns
from app.tui.turns import TurnView
from app.tui.widgets.chat_log import ChatLog
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import Sidebar
from app.tui.widgets.status_line import StatusLine

if TYPE_CHECKING:
    from app.mcp.config import ServerConfig


class EngineEvent(Message):
    """An event from the engine host, delivered on the UI's event loop."""

    def __init__(self, event: p.Event) -> None:
        super().__init__()
        self.event = event


QUIT_NOTE_AFTER_S = 0.5  # a quit that waits longer for the final save says so


class ChatApp(EngineRecovery, TurnView, ToolTurns, ChatActions, App[int]):
    """mlxchat's terminal chat."""

    CSS_PATH = Path(__file__).with_name("theme.tcss")
    TITLE = "mlxchat"

    def __init__(self, open_command: p.Open, *, mcp_servers: Sequence[ServerConfig] = (),
                 mcp_config: str | None = None, models_dir: Path | None = None) -> None:
        super().__init__()
        self.open_command = open_command
        self.client = EngineClient(lambda event: self.post_message(EngineEvent(event)))
        self.state: p.Conversation | None = None
        self.ready = False
        self.engine_batches = False  # chats answer side by side (``Ready.batches``); known once it is ready
        self.generating = False
        self.completion_lags: list[float] = []  # seconds from last token sent to reply complete on screen
        self.replies_done = 0
        self.updates = 0  # Conversation events received
        self.updates_at_done = 0  # ... when the last reply ended (the chat is settled once updates passes it)
        self._download: DownloadScreen | None = None
        self._quitting = False
        self.model_defaults: Mapping[str, float] = {}  # the model's recommended sampling (for the settings screen)
        self.collector = CollectorHold()
        self.mcp_config = mcp_config  # the MCP config file read (app.mcp.config), for the tools screen
        self.models_dir = models_dir  # --models-dir, whose folders the model switch (F5) lists
        self.mcp_servers = []
        self.always_allowed = {(server.name, name) for server in mcp_servers for name in server.always_allow}
        self.bundled_servers = frozenset(server.name for server in mcp_servers if server.bundled)
        if mcp_servers:
            from app.mcp.hub import McpHub
            self.mcp = McpHub(mcp_servers)

    def get_default_screen(self) -> Screen:
        return ChatScreen()

    def on_ready(self) -> None:
        """The screen is up: start the engine host (its events need the widgets)."""
        gc.freeze()  # what is loaded so far lives as long as the app (see gc_pauses)
        self.client.start()
        self.client.send(self.open_command)
        self._start_mcp()

    async def action_quit(self) -> None:
        """Quit once the engine has stopped the reply and saved the chat; pressed again, quit at once."""
        if self._quitting or not self.ready or not self.client.alive:
            self.client.kill()  # nothing to save (loading, or the engine is gone), or the user won't wait
            self.exit(0)
            return
        if self.state is not None and self.state.save_error:
            self.push_screen(ConfirmDialog(f"This chat could not be saved: {self.state.save_error}\n\n"
                                           "Quit anyway, and lose what was not saved?"), self._quit_unsaved)
            return
        self._quit_when_saved()

    def _quit_unsaved(self, yes: bool | None) -> None:
        if yes:
            self._quit_when_saved()

    def _quit_when_saved(self) -> None:
        self._quitting = True
        self.client.shut_down()
        note = self.set_timer(QUIT_NOTE_AFTER_S, lambda: self.notify(
            "Saving the chat before quitting… (ctrl+q again quits at once)", timeout=60))

        async def wait() -> None:
            await asyncio.to_thread(self.client.wait)
            note.stop()
            self.exit(0)
        self.run_worker(wait(), group="quit")

    async def on_unmount(self) -> None:
        """However the app ends (ctrl+q, a test's end, an error), the engine process ends with it, not later."""
        await asyncio.to_thread(self.client.close)
        if self.mcp is not None:
            await asyncio.to_thread(self.mcp.close)  # stdio servers end with the window

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for action in ACTIONS:
            yield SystemCommand(action.title, action.help, partial(self.run_action, action.action))
        logs = screen.query(ChatLog)
        view = logs.first().alternatives if logs else None
        for number in range(1, len(view.columns) + 1 if view is not None else 1):
            yield SystemCommand(f"Keep reply {number}", f"Keep reply {number} of the replies side by side; the others "
                                "go.", partial(self.action_pick, number))

    # widgets --------------------------------------------------------------------------

    @property
    def chat(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def status(self) -> StatusLine:
        return self.query_one(StatusLine)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    # engine events ----------------------------------------------------------------------

    async def on_engine_event(self, message: EngineEvent) -> None:
        handler = getattr(self, "_engine_" + type(message.event).__name__.lower(), None)
        try:
            if handler is not None:
                await handler(message.event)
        except NoMatches:
            pass  # the chat screen is gone: the app is closing

    async def _engine_progress(self, event: p.Progress) -> None:
        if self.ready:
            return
        if self._download is None:
            self._download = DownloadScreen(self.open_command.model or "the default model")
            self.push_screen(self._download, self._download_closed)
        self._download.progress(event.done, event.total)

    async def _engine_ready(self, event: p.Ready) -> None:
        self.ready = True
        self.engine_batches = event.batches
        self.model_defaults = {name: float(value) for name, value in event.defaults.items()
                               if isinstance(value, (int, float)) and not isinstance(value, bool)}
        if self._download is not None and self._download.is_current:
            self._download.dismiss(False)
        self._download = None
        self.status.model = event.target + (f" + {event.draft}" if event.draft else "")
        self.sub_title = self.status.model
        self.status.show_idle()
        self._offer_tools()  # a new engine (a restart, another model) knows no tools yet
        if event.note:
            self.notify(event.note, title="Model")

    async def _engine_conversation(self, event: p.Conversation) -> None:
        if not self.generating:  # the engine's chat now holds the finished reply
            self.pending_reply = None
        await self._show_turn(event)
        self.state = event
        self.updates += 1
        self.title = f"mlxchat · {event.title}"
        self.query_one(Sidebar).current = event.session_id

    async def _engine_prefill(self, event: p.Prefill) -> None:
        self.status.prefilling(event.done, event.total)

    async def _engine_done(self, event: p.Done) -> None:
        if self.chat.live is not None:
            await self.chat.live.finish()
        self.completion_lags.append(time.monotonic() - event.last_token_time)
        self.generating = False
        self.replies_done += 1
        self.updates_at_done = self.updates
        self.status.finished(event.stats, event.finish_reason)
        self.call_after_refresh(self.collector.release)  # once the finished reply is on screen

    async def _engine_generating(self, event: p.Generating) -> None:
        self.answering = event.session_ids
        self.query_one(Sidebar).mark(event.session_ids, event.picking)

    async def _engine_sessions(self, event: p.Sessions) -> None:
        sidebar = self.query_one(Sidebar)
        sidebar.show(event.rows, self.state.session_id if self.state else sidebar.current)

    async def _engine_notice(self, event: p.Notice) -> None:
        self.notify(event.text, severity=event.severity)

    async def _engine_exported(self, event: p.Exported) -> None:
        self.notify(f"Exported to {event.path}", title="Export")

    async def _engine_failure(self, event: p.Failure) -> None:
        if event.fatal:
            self.ready = False
            self.status.show_note(f"{event.title}: see the dialog")
        elif self.state is not None and not self.ready:  # a failed model switch: the old model stays
            self.ready = True
            self.status.show_idle()
        if event.returned_text is not None and not self.prompt.text.strip():
            self.prompt.load_text(event.returned_text)  # a refused message is not lost
        self.push_screen(ErrorDialog(event.title, event.message, event.fatal), self._failure_closed)

    def _failure_closed(self, quit_now: bool | None) -> None:
        if quit_now:
            self.run_worker(self.action_quit())

    def _download_closed(self, cancelled: bool | None) -> None:
        self._download = None
        if cancelled and not self.ready:  # ending the engine process stops the download at once
            self.client.kill()
            self.client.start()
            # mlxcore.defaults' embedded pair, named here so that the UI process stays off mlxcore
            self.open_command = p.Open(**{**self.open_command.__dict__, "model": "mini-target",
                                          "draft": None if self.open_command.no_draft else "mini-draft"})
            self.client.send(self.open_command)
            self.notify("Download cancelled: using the embedded demonstration models.", title="Model")

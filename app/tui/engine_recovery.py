"""When the engine process dies: keep the chat on screen and in its file, say so, offer a restart."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

from app.engine_host import protocol as p
from app.tui.host import ChatHost
from app.tui.screens.dialogs import ChoiceDialog
from mlxcore import MlxchatError


class EngineRecovery(ChatHost):
    """Mixed into ChatApp (``ChatHost`` says what it uses of it)."""

    engine_down = False  # the engine process ended unexpectedly and was not restarted yet
    pending_reply: str | None = None  # the streamed reply as generated, until the engine's chat state has it

    async def _engine_enginegone(self, event: p.EngineGone) -> None:
        self.generating, self.ready, self.engine_down = False, False, True
        if self.chat.live is not None:
            await self.chat.live.finish()  # the partial reply stays on screen
        await self.chat.remove_alternatives()  # replies side by side went with the engine: none was kept
        self.turn = 0
        saved = self._salvage()
        self.collector.release()
        self.status.show_note("The engine stopped: f9 or alt+s restarts it, ctrl+q quits")
        message = (f"The model process ended unexpectedly ({_exit_text(event.exit_code)}). Its log is "
                   f"{event.log_path}.\n\n{saved}")
        self.push_screen(ChoiceDialog("The engine stopped", message,
                                      [("restart", "Restart the engine (f9, alt+s)"), ("quit", "Quit"), ("close", "Close")]),
                         self._engine_gone_closed)

    def _salvage(self) -> str:
        """Write the chat as shown (the reply so far included) to its file; a sentence saying how it went."""
        state = self.state
        if state is None:
            return "No chat was open."
        reply, self.pending_reply = self.pending_reply, None
        history = list(state.messages) + ([("assistant", reply)] if reply else [])
        self.state = dataclasses.replace(state, messages=tuple(history))
        if state.file is None:
            return "This chat was not saved yet: restart the engine to go on with it, or copy what you need."
        from sessions import save_history
        from sessions import SessionLock
        try:
            with SessionLock.acquire(Path(state.file)):  # the dead engine's lock went with it
                save_history(Path(state.file), history)
        except MlxchatError as error:
            return f"The chat could not be saved: {error}\nRestart the engine to go on with it."
        # A store chat's address is no file of its own (sessions.store): name the store instead
        where = state.file if Path(state.file).is_file() else f"the session store ({Path(state.file).parent})"
        return f"Your chat is saved in {where}" + (", with the reply so far." if reply else ".")

    def _engine_gone_closed(self, choice: str | None) -> None:
        if choice == "quit":
            self.exit(0)
        elif choice == "restart":
            self.action_restart_engine()

    def action_restart_engine(self) -> None:
        """Start a new engine process on the chat as saved (or as shown, when it never was)."""
        if not self.engine_down:
            self.notify("The engine is running.")
            return
        # The chat keeps the settings it has now: the command line's were applied at the first start.
        command, state = dataclasses.replace(self.open_command, params={}, think=None, system=None), self.state
        if state is not None and state.file is not None and command.session_file:
            command = dataclasses.replace(command, session_file=state.file)
        elif state is not None and state.file is not None:
            command = dataclasses.replace(command, session_id=state.session_id)
        elif state is not None:
            command = dataclasses.replace(command, messages=state.messages, session_id=None)
        self.open_command = command
        self.engine_down = False
        self.status.show_note("Restarting the engine…")
        self.client.start()
        self.client.send(self.open_command)

    def _engine_running(self) -> bool:
        """False (and says what to do) while the engine is down."""
        if self.engine_down:
            self.notify("The engine stopped: press f9 or alt+s to restart it.", severity="warning")
        return not self.engine_down


def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        if -code == signal.SIGKILL:
            return f"killed by {name}: by the system for lack of memory, or by another program"
        return f"ended by {name}"
    return f"exit status {code}"

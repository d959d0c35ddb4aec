"""What the user can do: each action turns into a command for the engine host, or a dialog first."""

from __future__ import annotations

from textual.app import App

from app.options import model_catalog
from app.engine_host import protocol as p
from app.tui.clipboard import Copied, copy_notice, copy_text
from app.tui.host import ChatHost
from app.tui.screens.dialogs import ConfirmDialog, TextDialog
from app.tui.screens.help import HelpScreen
from app.tui.screens.model_picker import ModelPicker
from app.tui.screens.settings import ChosenSettings, SettingsScreen
from app.tui.text_parts import code_blocks, split_reply
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import Sidebar


class ChatActions(ChatHost):
    """Mixed into ChatApp: the user's intents. Uses ChatApp's client, state, chat, prompt and status."""

    alternatives_count: int
    answering: tuple[str, ...] = ()  # the stored chats generating a reply, on screen or not
    running_tools: bool
    engine_batches: bool
    tool_rounds: int
    _thinking_shown = False

    def _busy(self) -> bool:
        """True (and says so) while the chat on screen is answering or waits for a pick, or while there is no
        engine to ask."""
        if not self._engine_running():
            return True
        if self.running_tools:
            self.notify("The model's tool calls wait for your answer, or run.", severity="warning")
            return True
        if self.generating:
            self.notify("A reply is being written: wait, or press Esc to stop it.", severity="warning")
        elif self.picking:
            self.notify(f"Keep one of the replies first: keys 1-{self.picking} on them, their Keep button, or "
                        "ctrl+p.", severity="warning")
        return self.generating or bool(self.picking)

    def _generate(self, command: p.Command, replies: int = 1) -> None:
        if not isinstance(command, p.ToolResults):
            self.tool_rounds = 0  # the user spoke: the model may call tools again
        self.generating = True
        self.pending_reply = ""
        self.collector.hold()
        self.chat.follow()
        self.status.generating_started(replies)
        self.client.send(command)

    # sending ------------------------------------------------------------------------------

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        if self._busy():
            self.prompt.load_text(event.text)
            return
        await self.chat.sync(self.chat.records + [("user", event.text)])  # shown at once, not after the engine
        self._generate(p.Send(event.text))

    def action_stop(self) -> None:
        if self.generating:
            self.client.send(p.Stop())
        elif self.chat.alternatives is not None:
            self.chat.alternatives.focus()  # where 1-n keep a reply
        else:
            self.prompt.focus()

    def action_regenerate(self) -> None:
        if self._busy():
            return
        if not self.state or not self.state.messages or self.state.messages[-1][0] != "assistant":
            self.notify("There is no reply to regenerate yet.", severity="warning")
            return
        self._generate(p.Regenerate())

    def action_edit_last(self) -> None:
        users = [content for role, content in (self.state.messages if self.state else ()) if role == "user"]
        if self._busy() or not users:
            return
        self.push_screen(TextDialog("Edit your last message", users[-1]), self._edited)

    def _edited(self, text: str | None) -> None:
        if text and text.strip():
            self._generate(p.EditLast(text))

    # the chat -----------------------------------------------------------------------------

    def action_new_chat(self) -> None:
        if self._may_leave():
            self.client.send(p.Chat("new"))
            self.prompt.focus()

    def _may_leave(self) -> bool:
        """Whether the user may go to another chat now: a chat answering goes on in the background (where the
        engine batches, ``Ready.batches``: else a reply runs to its end first)."""
        if not self.engine_batches or self.running_tools:  # a tool's result goes to the chat on screen
            return not self._busy()
        if self._engine_running() and (self.generating or self.picking):
            self.notify("This chat goes on in the background: the sidebar (ctrl+b) shows when it is done.")
        return self._engine_running()

    def action_fork(self) -> None:
        if not self._busy():
            self.client.send(p.Chat("fork"))
            self.notify("Forked: you are now in the copy.")

    def action_clear(self) -> None:
        if not self._busy():
            self.client.send(p.Chat("clear"))

    def action_save(self) -> None:
        if not self._busy():
            self.client.send(p.Chat("save"))

    def action_rename(self) -> None:
        if self.state and self.state.session_id:
            self._ask_rename(self.state.session_id, self.state.title)
        else:
            self.notify("Send a message first: a chat is saved (and can be renamed) after its first reply.")

    def _ask_rename(self, session_id: str, title: str) -> None:
        def renamed(text: str | None) -> None:
            if text is not None and text.strip():
                self.client.send(p.ManageSession("rename", session_id, title=text.strip()))
        self.push_screen(TextDialog("Rename chat", title), renamed)

    def action_delete(self) -> None:
        if self.state and self.state.session_id and not self._busy():
            self._ask_delete(self.state.session_id, self.state.title)

    def _ask_delete(self, session_id: str, title: str) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.client.send(p.ManageSession("delete", session_id))
        self.push_screen(ConfirmDialog(f"Delete the chat “{title}”? This cannot be undone."), answered)

    def action_export(self) -> None:
        if self.state:
            self.client.send(p.ManageSession("export", self.state.session_id or ""))

    # settings -------------------------------------------------------------------------------

    def action_toggle_thinking(self) -> None:
        if self.state and not self._busy():
            self.client.send(p.Configure(think=not self.state.think))
            self.notify("Thinking " + ("off" if self.state.think else "on") + " for the next replies.")

    def action_toggle_thinking_blocks(self) -> None:
        self._thinking_shown = not self._thinking_shown
        for view in self.query(MessageView):
            view.set_thinking_expanded(self._thinking_shown)

    def action_settings(self) -> None:
        if self.state and not self._busy():
            self.push_screen(SettingsScreen(self.state, self.model_defaults, self.alternatives_count),
                             self._configured)

    def _configured(self, chosen: ChosenSettings | None) -> None:
        if chosen is not None:
            self.client.send(chosen.configure)
            self.alternatives_count = chosen.alternatives
            self.notify("Settings applied to the next replies.")

    def action_switch_model(self) -> None:
        if isinstance(self.screen, ModelPicker) or self._busy():  # F5 again: the picker is already open
            return
        if self.answering:
            self.notify("Other chats are still answering: wait for them before switching the model.",
                        severity="warning")
            return

        def chosen(ref: str | None) -> None:
            if ref and ref.strip():
                self.ready = False
                self.status.show_note(f"Loading {ref.strip()}…")
                self.open_command = p.Open(**{**self.open_command.__dict__, "model": ref.strip(), "draft": None})
                self.client.send(self.open_command)
        catalog = model_catalog(self.models_dir)  # what --model names: ask's and `mlxchat models`' list
        self.push_screen(ModelPicker(catalog.listing, self.open_command.model), chosen)

    # view -------------------------------------------------------------------------------------

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one(Sidebar)
        sidebar.display = not sidebar.display
        if sidebar.display:
            self.client.send(p.ListSessions())
            self.query_one("#session-list").focus()
        else:
            self.prompt.focus()

    def action_follow(self) -> None:
        self.chat.follow()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    # copying ----------------------------------------------------------------------------------

    def _last_answer(self) -> str | None:
        replies = [c for role, c in (self.state.messages if self.state else ()) if role == "assistant"]
        return split_reply(replies[-1])[1].strip() if replies else None

    def action_copy_reply(self) -> None:
        self._copy(self._last_answer(), "the last reply")

    def action_copy_code(self) -> None:
        blocks = code_blocks(self._last_answer() or "")
        self._copy(blocks[-1] if blocks else None, "the last code block")

    def on_message_view_copy_request(self, event: MessageView.CopyRequest) -> None:
        # named, not @on(...): Textual collects decorated handlers only from its own classes, not mixins
        self._copy(event.text, f"the {event.what}")

    def _copy(self, text: str | None, what: str) -> None:
        if not text:
            self.notify(f"Nothing to copy: there is no {what.removeprefix('the ')} yet.", severity="warning")
            return
        line, warning = copy_notice(self._copy_text(text), what, len(text))
        self.notify(line, severity="warning" if warning else "information")

    def copy_to_clipboard(self, text: str) -> None:
        """Textual's copy (a selection's Ctrl+C too): the platform's clipboard command, OSC 52 over SSH."""
        self._copy_text(text)

    def _copy_text(self, text: str) -> Copied:
        self._clipboard = text  # Textual's own paste buffer
        return copy_text(text, lambda osc52_text: App.copy_to_clipboard(self, osc52_text))

    # sidebar ------------------------------------------------------------------------------------

    def on_sidebar_chosen(self, event: Sidebar.Chosen) -> None:
        if (not self.state or event.session_id != self.state.session_id) and self._may_leave():
            self.client.send(p.OpenSession(event.session_id))

    def on_sidebar_search(self, event: Sidebar.Search) -> None:
        self.client.send(p.ListSessions(event.query))

    def on_sidebar_manage(self, event: Sidebar.Manage) -> None:
        if event.action == "delete":
            self._ask_delete(event.session_id, event.title)
        else:
            self._ask_rename(event.session_id, event.title)

"""Every user action of the chat: its key, its name and what it does.

One table feeds the key bindings, the command palette (ctrl+p) and the help screen. Every action has a key
besides an F-key (a Mac laptop's top row sends media keys unless fn is held), one that Terminal.app and iTerm2
pass to the app: a Ctrl key, or Alt (Option, where the terminal sends it as Meta); never Ctrl+arrows (Mission
Control), PageUp/PageDown or Home/End (Terminal.app keeps them). The footer shows a key's first name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class ChatAction:
    key: str  # Textual key name(s), comma-separated; the first is the footer's
    action: str  # App action name (without "action_")
    title: str  # shown in the palette and the help screen
    help: str  # one sentence
    footer: bool = False  # shown in the footer


ACTIONS: tuple[ChatAction, ...] = (
    ChatAction("ctrl+n", "new_chat", "New chat", "Start a new chat (the current one stays saved).", True),
    ChatAction("ctrl+r", "regenerate", "Regenerate", "Replace the last reply with a new one.", True),
    ChatAction("f7,alt+a", "alternatives", "Replies side by side",
               "Several replies at once to the message typed (or in place of the last reply); keep one."),
    ChatAction("ctrl+l", "edit_last", "Edit last message", "Change your last message and answer it again."),
    ChatAction("ctrl+f", "fork", "Fork chat", "Continue in a copy of this chat; the original stays."),
    ChatAction("f8,alt+c", "clear", "Clear chat", "Forget this chat's messages (the system prompt stays)."),
    ChatAction("ctrl+o", "copy_reply", "Copy last reply", "Copy the last reply to the clipboard (pbcopy, wl-copy or xclip; OSC 52 over SSH).", True),
    ChatAction("ctrl+g", "copy_code", "Copy last code block", "Copy the last code block of the last reply."),
    ChatAction("ctrl+s", "save", "Save", "Save now (chats are also saved after every reply)."),
    ChatAction("f2,alt+r", "rename", "Rename chat", "Give this chat a title."),
    ChatAction("f12,alt+d", "delete", "Delete chat", "Delete this chat from the session store."),
    ChatAction("f3,alt+e", "export", "Export to Markdown", "Write this chat to a Markdown file."),
    ChatAction("ctrl+t", "toggle_thinking", "Toggle thinking", "Let the model think before answering, or not."),
    ChatAction("ctrl+underscore,f6", "toggle_thinking_blocks", "Show/hide thinking",
               "Expand or collapse the replies' thinking blocks."),
    ChatAction("ctrl+y,f10", "settings", "Settings", "System prompt, temperature, top-p, max tokens, draft.", True),
    ChatAction("f4,alt+t", "mcp_tools", "MCP tools", "The MCP servers and their tools; switch a tool off or on."),
    ChatAction("f5,alt+m", "switch_model", "Switch model", "Pick a model to load (those `mlxchat models` lists, or another); "
               "the chat continues on it."),
    ChatAction("f9,alt+s", "restart_engine", "Restart the engine",
               "Start the model process again after it stopped; the chat goes on from its file."),
    ChatAction("ctrl+b", "toggle_sidebar", "Sessions", "Show or hide the list of saved chats.", True),
    ChatAction("ctrl+end,ctrl+right_square_bracket", "follow", "Follow new text", "Jump to the bottom and follow the reply again."),
    ChatAction("escape", "stop", "Stop reply", "Stop the reply of the chat on screen (the text so far is kept)."),
    ChatAction("ctrl+backslash,f1", "help", "Help", "Show the keys.", True),
)

OTHER_KEYS: tuple[tuple[str, str], ...] = (
    ("enter", "Send the message"),
    ("shift+enter, ctrl+j", "New line in the message"),
    ("up / down", "Earlier messages you sent (at the first / last line)"),
    ("pageup / pagedown", "Scroll the chat (shift+pageup / shift+pagedown in Terminal.app)"),
    ("tab / shift+tab", "Move focus (messages, sessions, input)"),
    ("c, 1-9 on a message", "Copy the message, or its code block n"),
    ("1-4 on the replies", "Keep that one of the replies side by side (or click its Keep button)"),
    ("mouse drag, ctrl+c", "Select text and copy it"),
    ("delete, r in sessions", "Delete or rename the highlighted chat"),
    ("ctrl+p", "Command palette"),
    ("ctrl+q", "Quit"),
)


def bindings(actions: Iterable[ChatAction] = ACTIONS) -> list[Binding]:
    """Chat screen bindings for the app's actions; priority, so that they work while typing
    (except Escape, which dialogs and the input handle first)."""
    return [Binding(a.key, f"app.{a.action}", a.title, show=a.footer, priority=a.action != "stop")
            for a in actions]


def key_label(key: str) -> str:
    """A Textual key name as people write it: ``ctrl+backslash`` -> ``Ctrl+\\``, ``alt+m`` -> ``Alt+M``."""
    names = {"backslash": "\\", "right_square_bracket": "]", "underscore": "_"}
    return "+".join(names.get(part, part.upper() if len(part) == 1 else part.capitalize()) for part in key.split("+"))

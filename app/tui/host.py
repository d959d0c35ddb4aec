"""What the window's mixins (actions, turns, tool turns) use of the ChatApp they are mixed into.

At run time a mixin is a plain class: ChatApp brings Textual's App and the
attributes. For the type checker each mixin extends ``ChatHost``, an App that
declares those attributes and the methods the mixins call on one another, so
that ``self.chat`` or ``self.notify(...)`` in a mixin is checked as in ChatApp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from abc import abstractmethod
    from collections.abc import Mapping
    from pathlib import Path

    from textual.app import App

    from app.engine_host import protocol as p
    from app.tui.engine_client import EngineClient
    from app.tui.gc_pauses import CollectorHold
    from app.tui.widgets.chat_log import ChatLog
    from app.tui.widgets.prompt_input import PromptInput
    from app.tui.widgets.status_line import StatusLine

    class ChatHost(App[int]):
        """ChatApp as its mixins see it (see the module docstring)."""

        client: EngineClient
        open_command: p.Open
        models_dir: Path | None  # --models-dir, for the model switch
        state: p.Conversation | None
        model_defaults: Mapping[str, float]  # the model's recommended sampling
        ready: bool
        generating: bool
        pending_reply: str | None
        collector: CollectorHold

        @property
        def chat(self) -> ChatLog: ...

        @property
        def status(self) -> StatusLine: ...

        @property
        def prompt(self) -> PromptInput: ...

        @property
        @abstractmethod
        def picking(self) -> int:
            """How many replies side by side wait for the user to keep one (0: none)."""

        @abstractmethod
        def _engine_running(self) -> bool: ...

        @abstractmethod
        def _busy(self) -> bool: ...

        @abstractmethod
        def _generate(self, command: p.Command, replies: int = 1) -> None: ...
else:
    ChatHost = object

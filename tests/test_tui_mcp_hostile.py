"""What an MCP server sends cannot harm the window: escape codes in a tool's description and result never reach
the terminal, a server that cannot start is told on the main screen, and a result of a megabyte is cut to fit
the context so that the chat goes on.

As users run it: the engine in its own process (replies scripted, ``mcp_engine``), the servers children over
stdio (``mcp_hostile_server.py``). The escape-code test runs the real window in a pseudo-terminal and reads
every byte it writes there.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from mcp_engine import use_script
from test_tui_mcp import call

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent
HOSTILE = str(TESTS / "mcp_hostile_server.py")
MISSING = "/no/such/mlxchat-mcp-server"
RULES = [
    ("<tool_response>\nhello BOOM", "Greeted."),
    ("<tool_response>\n19\n<", "The sum is 19."),
    ("[cut: ", call("add", a=12, b=7)),
    ("Say hello.", call("greet")),
    ("Flood me.", call("flood")),
]


def write_config(tmp_path: Path) -> Path:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"hostile": {"command": sys.executable, "args": [HOSTILE]},
                                                 "gone": {"command": MISSING}}}))
    return config


@pytest.fixture(autouse=True)
def scripted(tmp_path, monkeypatch):
    use_script(tmp_path, monkeypatch, RULES)


class Terminal:
    """A process on a pseudo-terminal of 110 x 34: every byte it writes is kept in ``raw``."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 34, 110, 0, 0))
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                        start_new_session=True)
        os.close(slave)
        self.raw = b""

    def read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            try:
                self.raw += os.read(self.master, 1 << 16)
            except OSError:  # the process ended
                pass

    def wait_for(self, text: bytes, timeout: float = 90.0, since: int = 0) -> None:
        """Until the process wrote ``text`` (after its first ``since`` bytes)."""
        deadline = time.monotonic() + timeout
        while text not in self.raw[since:]:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"{text!r} never showed; the terminal's last bytes: {self.raw[-2000:]!r}")
            self.read(0.2)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        os.close(self.master)


def test_escape_codes_from_a_server_never_reach_the_terminal_and_a_server_that_cannot_start_is_told(tmp_path):
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="110", LINES="34")
    terminal = Terminal([sys.executable, str(TESTS / "tui_pty_window.py"), str(write_config(tmp_path))], env)
    try:
        terminal.wait_for(b"mini-target")  # the engine is ready
        terminal.wait_for(b"no/such/mlxchat-mcp-server")  # told on the main screen: no F4 pressed
        terminal.type(b"Say hello.")
        terminal.wait_for(b"Say hello.")
        terminal.type(b"\r")
        terminal.wait_for(b"wants to run greet")
        terminal.wait_for(b"ZAP^[[2JZAP")  # the description, its escape codes shown, not acted on
        terminal.type(b"a")
        terminal.wait_for(b"Greeted.")
        terminal.wait_for(b"BOOM^[[2JBOOM")  # the result, in the title of its block
        # still said on the main screen once the reply is done, long after its note went
        terminal.wait_for(b"gone did not start", since=terminal.raw.index(b"Greeted."))
        terminal.type(b"\x11")  # ctrl+q
        deadline = time.monotonic() + 60
        while terminal.process.poll() is None and time.monotonic() < deadline:
            terminal.read(0.2)
    finally:
        terminal.close()
    raw = terminal.raw
    for sent in (b"ZAP\x1b", b"BOOM\x1b", b"\x1b]0;PWNED", b"PWNED\x07"):
        assert sent not in raw, f"{sent!r} reached the terminal"


def test_a_megabyte_result_is_cut_to_fit_and_the_chat_goes_on_with_a_valid_call(tmp_path, monkeypatch):
    """Before: "Cannot send this: The prompt has 1001087 tokens", the tool turn gone, the call left unanswered."""
    from app.mcp.config import read_config
    from app.tui import engine_client
    from app.tui.app import ChatApp
    from mcp_engine import scripted_engine_process
    from test_tui_helpers import SIZE, open_command, wait_for, wait_ready

    monkeypatch.setattr(engine_client, "run_engine_process", scripted_engine_process)
    config = write_config(tmp_path)

    async def chat():
        app = ChatApp(open_command(max_tokens=200), mcp_servers=read_config(config), mcp_config=str(config))
        app.always_allowed |= {("hostile", "flood"), ("hostile", "add")}  # as "alwaysAllow" in the config
        async with app.run_test(size=SIZE) as pilot:
            await wait_ready(pilot, app)
            await wait_for(pilot, lambda: app.tools_ready, what="the MCP servers' tools")
            app.prompt.load_text("Flood me.")
            await pilot.press("enter")
            try:
                await wait_for(pilot, lambda: app.state.messages[-1:] == (("assistant", "The sum is 19."),)
                               and not app.generating and not app.running_tools, timeout=120)
            except AssertionError:
                shown = [(role, len(text), text[-100:]) for role, text in app.state.messages]
                raise AssertionError(f"no answer; the chat: {shown}; the screen: {app.screen}") from None
            return app.state.messages
    messages = asyncio.run(chat())
    assert [role for role, _ in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    cut = messages[2][1]
    assert cut.startswith("w0 w1 w2") and cut.endswith(" characters]") and len(cut) < 20_000
    removed = int(cut.rsplit("[cut: ", 1)[1].split()[0])
    assert removed + len(cut.rsplit("\n[cut: ", 1)[0]) == 1_000_000, "the note says how much was cut"
    assert messages[3][1].endswith(call("add", a=12, b=7)) and messages[4][1] == "19", "the next call is whole"

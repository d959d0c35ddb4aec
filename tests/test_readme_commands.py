"""README's commands, run as a user runs them: every shell line and Python block of README.md's code blocks.

The ones that can run here run offline on the embedded pair, in README's order, in a fresh folder with
its own HOME and MLXCHAT_HOME (and ``.venv`` linked to this environment), and must exit with status 0.
Two stand-ins are filled in, and only these: ``ID`` in ``mlxchat sessions`` commands becomes a chat the
test stored first, and port 8080 in the client examples becomes the port of the server that README's
``mlxchat serve`` line started in the background. Every other command is skipped by a rule of ``SKIP``,
whose reason the skip names (``pytest -rs`` lists them); a rule that matches no command fails, so the
list cannot go stale. README's links to files and headings must lead somewhere, and CI (``.ci/run``)
must run README's first two commands as written.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from serve_process import free_port, http

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 300  # a guide for users: engineering detail belongs in docs/ (issue 34)
COMMAND_S = 180  # one command's bound; every one of them ends long before on this host
SERVE = ".venv/bin/mlxchat serve"  # README's plain serve line: started in the background, for the clients

# (reason, pattern): a command that matches is not run, for the first reason whose pattern it matches
SKIP: list[tuple[str, str]] = [
    ("installs mlxchat: CI runs README's first two commands (.ci/run)", r"^bash scripts/install\.sh"),
    ("needs several machines or ranks (tests/test_distributed.py runs two ranks)",
     r"^mlx\.(launch|distributed_config)"),
    ("Claude Code and its settings", r"^(export ANTHROPIC_|claude$)"),
    ("opens the chat window, which waits for keys (tests/test_fault_tui.py drives it)",
     r"^\.venv/bin/mlxchat(?! (ask|sessions|serve|bench)\b)(?!.*--help)"),
    ("a server with a key or a model of your own (README's plain `mlxchat serve` runs)",
     r"^\.venv/bin/mlxchat serve ."),
    ("downloads a model from the Hugging Face hub", r"mlx-community/"),
    ("a model folder of your own", r"\./my-mlx-model"),
]


@dataclass(frozen=True)
class Command:
    """One shell line (continuations joined) or one Python block of README."""

    kind: str  # "bash" or "python"
    text: str
    line: int  # README's line where it starts

    @property
    def name(self) -> str:
        return f"L{self.line}:{self.kind}:{self.text.splitlines()[0][:60]}"


def readme_commands(text: str) -> list[Command]:
    """README's commands in order: each line of a ``bash`` block, each ``python`` block whole."""
    commands, block, kind, start = [], [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and kind is None:
            kind, block, start = fence.group(1) or "text", [], number + 1
        elif fence:
            commands += _commands_of(kind, block, start)
            kind = None
        elif kind is not None:
            block.append(line)
    return commands


def _commands_of(kind: str, lines: list[str], start: int) -> list[Command]:
    if kind == "python":
        return [Command("python", "\n".join(lines) + "\n", start)]
    if kind != "bash":
        return []
    commands, joined, first = [], "", 0
    for offset, line in enumerate(lines):
        if not joined and (not line.strip() or line.lstrip().startswith("#")):
            continue
        first = first if joined else start + offset
        line = _without_comment(line, _open_quote(joined))
        if line.endswith("\\"):
            joined += line[:-1] + " "
        elif _open_quote(joined + line):  # a quoted string goes on to the next line, as bash reads it
            joined += line + "\n"
        else:
            commands.append(Command("bash", (joined + line).strip(), first))
            joined = ""
    return commands


def _open_quote(text: str) -> str | None:
    """The quote that ``text`` ends inside, if any (comments are cut before)."""
    quote = None
    for char in text:
        if char in "'\"" and quote in (None, char):
            quote = None if quote else char
    return quote


def _without_comment(line: str, quote: str | None = None) -> str:
    """The line less a trailing ``# comment`` outside quotes; ``quote``: the one the line starts inside."""
    for index, char in enumerate(line):
        if char in "'\"" and quote in (None, char):
            quote = None if quote else char
        elif char == "#" and quote is None and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line


def skip_reason(command: Command) -> str | None:
    for reason, pattern in SKIP:
        if any(re.search(pattern, line) for line in command.text.splitlines()):
            return reason
    return None


COMMANDS = readme_commands(README.read_text())


class Workspace:
    """A folder as a user's: ``.venv`` linked to this environment, its own HOME and store, offline."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "home").mkdir()
        (root / ".venv").symlink_to(Path(sys.prefix))
        assert (root / ".venv/bin/mlxchat").exists(), f"no mlxchat in {sys.prefix}: install it (README)"
        self.env = dict(os.environ, HOME=str(root / "home"), MLXCHAT_HOME=str(root / "mlxchat"),
                        MLXCHAT_OFFLINE="1", HF_HUB_OFFLINE="1")
        self.stored_id: str | None = None
        self.server: subprocess.Popen | None = None
        self.port = 0

    def run(self, command: Command) -> subprocess.CompletedProcess:
        if command.kind == "python":
            script = self.root / f"readme_{command.line}.py"
            script.write_text(command.text)
            argv = [str(self.root / ".venv/bin/python"), script.name]
        else:
            argv = ["bash", "-o", "pipefail", "-c", command.text]
        return subprocess.run(argv, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=COMMAND_S)

    def store_a_chat(self) -> str:
        """A chat in the store, for README's ``sessions ... ID`` lines (the window's autosave makes them)."""
        if self.stored_id is None:
            made = self.run(Command("python", "from mlxcore import open_engine\nfrom sessions import ChatSession, "
                                    "SessionStore\nchat = ChatSession(open_engine().engine, enable_thinking=False)\n"
                                    "chat.send('My name is Ada.')\nprint(SessionStore().save(chat).id)\n", 0))
            assert made.returncode == 0, made.stderr
            self.stored_id = made.stdout.split()[-1]
        return self.stored_id

    def start_server(self, command: str) -> None:
        self.port = free_port()
        log = open(self.root / "serve.log", "wb")
        self.server = subprocess.Popen(["bash", "-c", f"exec {command} --port {self.port}"], cwd=self.root,
                                       env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + COMMAND_S
        while time.monotonic() < deadline and self.server.poll() is None:
            try:
                if http("GET", f"http://127.0.0.1:{self.port}/health", timeout=2)[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)  # not listening yet
        raise AssertionError(f"`{command}` did not answer /health:\n{(self.root / 'serve.log').read_text()}")

    def stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            self.server.wait(timeout=30)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    space = Workspace(tmp_path_factory.mktemp("readme"))
    yield space
    space.stop_server()


def filled_in(command: Command, space: Workspace) -> Command:
    """The command with README's stand-ins replaced: ``ID`` (a stored chat), port 8080 (the test's server)."""
    text = command.text
    if re.search(r"mlxchat sessions \w+ ID\b", text):
        text = re.sub(r"\bID\b", space.store_a_chat(), text)
    if "127.0.0.1:8080" in text:
        if space.server is None:  # this test alone (-k): README's serve line starts it
            space.start_server(SERVE)
        text = text.replace("127.0.0.1:8080", f"127.0.0.1:{space.port}")
    return Command(command.kind, text, command.line)


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=[command.name for command in COMMANDS])
def test_readme_command_runs(command: Command, workspace: Workspace):
    reason = skip_reason(command)
    if reason:
        pytest.skip(reason)
    if command.kind == "bash" and command.text == SERVE:
        workspace.start_server(command.text)
        return
    result = workspace.run(filled_in(command, workspace))
    assert result.returncode == 0, f"README line {command.line} exited {result.returncode}:\n{result.stderr[-3000:]}"
    if command.kind == "python" or "mlxchat" in command.text:  # not a line that writes a file for the next one
        assert result.stdout.strip(), f"README line {command.line} printed nothing"


def test_every_skip_rule_still_matches_a_command():
    stale = [reason for reason, pattern in SKIP
             if not any(skip_reason(command) == reason for command in COMMANDS)]
    assert not stale, f"rules that skip nothing any more (remove them): {stale}"


def test_readme_holds_commands_of_each_kind_and_runs_most():
    ran = [command for command in COMMANDS if skip_reason(command) is None]
    assert {command.kind for command in ran} == {"bash", "python"}
    assert len(ran) >= len(COMMANDS) / 2, [command.name for command in ran]


def test_ci_runs_readme_first_two_commands_as_written():
    ci = (ROOT / ".ci/run").read_text()
    first_two = [command.text for command in COMMANDS[:2]]
    assert first_two[0].startswith("bash scripts/install.sh &&") and first_two[1].endswith("pytest -q")
    assert all(command in ci for command in first_two), first_two


def test_readme_is_a_guide_of_at_most_a_few_hundred_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README has {lines} lines: move engineering detail into docs/"


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"https?://", target):
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif fragment and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            if fragment not in {anchor(heading) for heading in headings}:
                broken.append(target)
    return broken


@pytest.mark.parametrize("page", ["README.md", "docs/architecture.md", "docs/internals.md", "docs/benchmarks.md",
                                  "docs/decisions.md", "docs/serve.md", "docs/several_machines.md"])
def test_links_lead_to_files_and_headings(page: str):
    assert not broken_links(ROOT / page)

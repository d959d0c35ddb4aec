"""The coding agents themselves, as their users run them, against `mlxchat serve` on a loopback port (issue 59).

Claude Code (``claude -p``), Codex (``codex exec``), Qwen Code (``qwen -p``) and
opencode (``opencode run``), each the current npm release that ``scripts/install.sh
test`` puts in ``.venv/agents``, each pointed at one server for the module, two turns
each (the second continues the first's session). The model is ``reply_model``: a
Qwen3 with a 40,960-token context that answers ``REPLY`` and stops, whatever the
prompt (6-14k tokens of the agents' system prompts and tools). Each turn must exit 0
with the reply, every request of it must succeed (a client that retries after a 400
hides nothing here), and the second turn's requests together (Qwen Code's memory request beside the
main one) must find at least 95% of their prompts in the prefix cache, as the server's log line for it
says (``prompt=N cached=M``). A new release that breaks any of this fails here.

The agents reach nothing but the server: a temporary HOME holds their settings (the
server's address, the model, no telemetry, no update check) and nothing of the
user's. Where npm is missing the agents cannot be installed and the tests skip;
where npm is present the agents must be installed (``bash scripts/install.sh test``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from reply_model import REPLY, write_reply_model
from serve_process import ROOT, ServeProcess

BIN = ROOT / ".venv" / "agents" / "node_modules" / ".bin"
MODEL = "reply-model"
TURN_S = 240  # a bound for one turn of an agent (about 10-40 s here: node's start and a prompt read on 2 cores)
MIN_CACHED = 0.95
ASKED = ("Say hello.", "Say it again.")
LOGGED = re.compile(r" POST (\S+) (\d{3}) .*?(?:prompt=(\d+) cached=(\d+))?$")


@dataclass(frozen=True)
class Agent:
    """How one agent is set up and run: its command, and the settings files and environment it reads."""

    name: str  # its npm command
    turn: Callable[[str, bool], list[str]]  # (prompt, continue the last session) -> argv after the command
    setup: Callable[[ServeProcess, Path], dict[str, str]]  # writes its settings under HOME; its environment


def claude_setup(server: ServeProcess, home: Path) -> dict[str, str]:
    models = {f"ANTHROPIC_DEFAULT_{size}_MODEL": MODEL for size in ("HAIKU", "SONNET", "OPUS")}
    # The tokens-left reminder is off unless Anthropic's feature flags turn it on: on here, counting down.
    return models | {"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "unused", "ANTHROPIC_MODEL": MODEL,
                     "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                     "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
                     "CLAUDE_CODE_TOTAL_TOKENS_REMINDER": "countdown"}


def codex_setup(server: ServeProcess, home: Path) -> dict[str, str]:
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text(f"""model = "{MODEL}"
model_provider = "mlxchat"
model_context_window = 40960
check_for_update_on_startup = false
web_search = "disabled"

[analytics]
enabled = false

[model_providers.mlxchat]
name = "mlxchat"
base_url = "{server.url}/v1"
wire_api = "responses"
""")
    return {"CODEX_HOME": str(home / ".codex")}


def qwen_setup(server: ServeProcess, home: Path) -> dict[str, str]:
    (home / ".qwen").mkdir()
    settings = {"general": {"enableAutoUpdate": False}, "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False}}
    (home / ".qwen" / "settings.json").write_text(json.dumps(settings))
    return {"OPENAI_BASE_URL": f"{server.url}/v1", "OPENAI_API_KEY": "unused", "OPENAI_MODEL": MODEL}


def opencode_setup(server: ServeProcess, home: Path) -> dict[str, str]:
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "mlxchat",
                "options": {"baseURL": f"{server.url}/v1", "apiKey": "unused"}, "models": {MODEL: {"name": MODEL}}}
    config = {"$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
              "model": f"mlxchat/{MODEL}", "small_model": f"mlxchat/{MODEL}", "provider": {"mlxchat": provider}}
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text(json.dumps(config))
    return {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"}


AGENTS = [
    Agent("claude", lambda prompt, again: ["-p", *(["--continue"] if again else []), prompt], claude_setup),
    Agent("codex", lambda prompt, again: ["exec", "--skip-git-repo-check", *(["resume", "--last"] if again else []),
                                          prompt], codex_setup),
    Agent("qwen", lambda prompt, again: [*(["--continue"] if again else []), "-p", prompt], qwen_setup),
    Agent("opencode", lambda prompt, again: ["run", *(["--continue"] if again else []), prompt], opencode_setup),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A --models-dir holding the reply model."""
    folder = tmp_path_factory.mktemp("agent-models")
    write_reply_model(folder / MODEL)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory, models):
    with ServeProcess(tmp_path_factory.mktemp("agents-serve"), pair=serving(models)) as running:
        yield running


def serving(models: Path) -> tuple[str, ...]:
    return ("--models-dir", str(models), "--model", MODEL, "--no-draft")


def installed(name: str) -> Path:
    """The agent's command in .venv/agents; a skip where npm is missing, a failure where it was not installed."""
    command = BIN / name
    if command.exists():
        return command
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed, so the coding agents are not (scripts/install.sh installs them with it)")
    pytest.fail(f"{command} is missing: run `bash scripts/install.sh test` (it installs the agents with npm)")


def run_turn(command: Path, agent: Agent, prompt: str, again: bool, home: Path, env: dict[str, str],
             server: ServeProcess) -> tuple[subprocess.CompletedProcess[str], list[tuple[str, int, int, int]]]:
    """One turn of ``agent`` in ``home``'s work folder: the finished process, and the server's log lines for
    its requests as (path, status, prompt tokens, cached tokens)."""
    seen = len(server.log())
    done = subprocess.run([str(command), *agent.turn(prompt, again)], cwd=home / "work", env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TURN_S)
    requests = [(m[1], int(m[2]), int(m[3] or 0), int(m[4] or 0)) for line in server.log()[seen:].splitlines()
                if (m := LOGGED.search(line)) and m[1].startswith("/v1/")]
    return done, requests


def agent_home(agent: Agent, server: ServeProcess, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A temporary HOME with ``agent``'s settings for ``server`` and an empty work folder; its environment."""
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "TMPDIR": str(tmp_path),
           **{f"XDG_{kind}_HOME": str(home / f".{kind.lower()}") for kind in ("CONFIG", "DATA", "CACHE", "STATE")}}
    return home, env | agent.setup(server, home)


@pytest.mark.slow
@pytest.mark.parametrize("agent", AGENTS, ids=[agent.name for agent in AGENTS])
def test_an_agent_answers_two_turns_and_the_second_reads_the_first_from_the_cache(agent, server, tmp_path):
    command = installed(agent.name)
    home, env = agent_home(agent, server, tmp_path)
    version = subprocess.run([str(command), "--version"], env=env, capture_output=True, text=True,
                             timeout=TURN_S).stdout.strip()
    for again, prompt in enumerate(ASKED):
        done, requests = run_turn(command, agent, prompt, bool(again), home, env, server)
        said = f"{agent.name} {version}, turn {again + 1}: exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
        assert done.returncode == 0, said
        assert done.stdout.strip().splitlines()[-1:] == [REPLY], said
        assert requests and all(status == 200 for _, status, _, _ in requests), f"{requests}\n{said}"
    prompt_tokens, cached = sum(request[2] for request in requests), sum(request[3] for request in requests)
    assert cached >= MIN_CACHED * prompt_tokens, f"{agent.name} {version}: turn 2 read {cached} of {prompt_tokens} " \
                                                 f"prompt tokens from the cache; its requests: {requests}"


# Claude Code's tool loop, on a server whose model calls Read when asked to (tests/serve_scripted.py) and answers
# ANSWERED once it sees a tool's result followed by Claude Code's tokens-left note, rendered where it stands.
NOTE_AFTER_RESULT = "</tool_response><|im_end|>\n<|im_start|>system\n<total_tokens>"
ANSWERED = "The file says plum."


@pytest.mark.slow
def test_claude_codes_tool_loop_reads_each_request_before_from_the_cache(models, tmp_path):
    """Claude Code puts a ``<total_tokens>N tokens left</total_tokens>`` system message after each tool result
    (with its reminder on), N new each time: the request after the call still reads the one before from the
    cache, as the note is rendered after the result, not moved to the front."""
    agent = AGENTS[0]
    command = installed(agent.name)
    (tmp_path / "serve").mkdir()
    script, notes = tmp_path / "script.json", tmp_path / "home" / "work" / "notes.txt"
    call = {"name": "Read", "arguments": {"file_path": str(notes)}}
    script.write_text(json.dumps([[NOTE_AFTER_RESULT, ANSWERED],
                                  ["Read notes.txt", f"<tool_call>\n{json.dumps(call)}\n</tool_call>"]]))
    with ServeProcess(tmp_path / "serve", pair=serving(models), script="serve_scripted.py",
                      env={"MLXCHAT_TEST_SCRIPT": str(script)}) as scripted:
        home, env = agent_home(agent, scripted, tmp_path)
        notes.write_text("The secret word is plum.\n")
        done, requests = run_turn(command, agent, "Read notes.txt and say what it holds.", False, home, env, scripted)
    said = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}\n{requests}"
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [ANSWERED], said
    assert len(requests) == 2 and all(status == 200 for _, status, _, _ in requests), said
    (_, _, first, _), (_, _, second, cached) = requests
    assert cached >= first - 16, f"the request after the call read {cached} of the first one's {first} tokens"

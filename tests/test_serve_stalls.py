"""Nothing a client or a model folder sends stalls `mlxchat serve` (issue 63), on a real server on a loopback port.

Chat templates from a --models-dir: one that loops (three nested ``range(100000)``) and one that builds a
gigabyte string fail their model's load (tried once, in a worker process with a deadline), one that loops,
is refused by the sandbox or refuses the messages only for some messages fails those requests; /health
answers within ``HEALTH_S`` throughout, and SIGTERM ends the server while a render is stuck. JSON schemas
too big for the grammar library are 400s before anything compiles, naming the construct, in short bodies,
without counting as engine failures; three at once leave a running stream and /health flowing.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from assets import MODELS_DIR
from serve_process import MODEL, ServeProcess, http, normal_reply, poll_until

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
HEALTH_S = 1.0  # the longest /health may take while a bad template or schema is being dealt with
GAP_S = 1.0  # the longest pause of a running stream meanwhile
EXIT_S = 10.0  # SIGTERM to exit
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}

LOOP = ("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{{ '' }}"
        "{% endfor %}{% endfor %}{% endfor %}")
BOMB = "{{ 'x' * 1000000000 }}"
# The embedded template, after a prelude that misbehaves only for some last messages (the load's probe passes)
TRIGGERS = ("{%- if messages[-1].content == 'spin' -%}" + LOOP +
            "{%- elif messages[-1].content == 'sandbox' -%}{%- set x = [] -%}{{ x.append(1) }}"
            "{%- elif messages[-1].content == 'refuse' -%}{{ raise_exception('Say please.') }}{%- endif -%}")
TEMPLATES = {"loop-template": LOOP, "bomb-template": BOMB, "spin-template": TRIGGERS + "{{EMBEDDED}}"}


def models_dir(tmp: Path) -> Path:
    """The embedded draft's files under three names, each with a chat template of ``TEMPLATES``."""
    folder = tmp / "models"
    source = MODELS_DIR / "mini-draft"
    config = json.loads((source / "tokenizer_config.json").read_text())
    for name, template in TEMPLATES.items():
        model = folder / name
        model.mkdir(parents=True)
        for file in source.iterdir():
            if file.name != "tokenizer_config.json":
                (model / file.name).symlink_to(file)
        bad = config | {"chat_template": template.replace("{{EMBEDDED}}", config["chat_template"])}
        (model / "tokenizer_config.json").write_text(json.dumps(bad))
    broken = folder / "bad-config"  # a model folder whose config.json is not JSON
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").symlink_to(source / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stalls")
    with ServeProcess(tmp, "--models-dir", str(models_dir(tmp)), "--max-models", "2") as running:
        running.reference = normal_reply(running)
        yield running


class HealthWatch:
    """Asks /health over and over while a test runs; ``slowest``: its longest answer (seconds)."""

    def __init__(self, server: ServeProcess) -> None:
        self.server, self.slowest, self.answers = server, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            status = http("GET", f"{self.server.url}/health", timeout=30)[0]
            self.slowest = max(self.slowest, time.monotonic() - start)
            self.answers += status == 200
            self._stop.wait(0.05)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def chat(server: ServeProcess, model: str, content: str = "Hello.", **fields) -> tuple[int, dict]:
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": content}], **NO_THINK,
            **fields}
    status, _, reply = http("POST", server.url + CHAT, body, timeout=60)
    return status, reply


@pytest.mark.parametrize("model", ["loop-template", "bomb-template"])
def test_a_template_that_loops_or_explodes_fails_its_load_and_health_answers(server, model):
    with HealthWatch(server) as health:
        status, reply = chat(server, model)
    assert status == 500 and reply["error"]["code"] == "model_load_failed", reply
    assert "chat template" in reply["error"]["message"], reply
    assert health.answers and health.slowest < HEALTH_S, health.slowest
    assert model not in http("GET", f"{server.url}/health")[2]["models_loaded"]
    assert normal_reply(server) == server.reference


def test_a_template_that_fails_on_some_messages_fails_those_requests(server):
    with HealthWatch(server) as health:
        spun = chat(server, "spin-template", "spin")
        refused = chat(server, "spin-template", "sandbox")
        asked = chat(server, "spin-template", "refuse")
        fine = chat(server, "spin-template", "Hello.")
    assert spun[0] == 500 and "chat template" in spun[1]["error"]["message"], spun
    assert "did not finish" in spun[1]["error"]["message"], spun
    assert refused[0] == 500 and "sandbox" in refused[1]["error"]["message"], refused
    assert asked[0] == 400 and "Say please." in asked[1]["error"]["message"], asked
    assert fine[0] == 200, fine
    assert health.answers and health.slowest < HEALTH_S, health.slowest
    assert "Traceback" not in server.log()


def test_a_model_that_cannot_load_is_told_without_the_servers_paths(server):
    status, reply = chat(server, "bad-config")
    assert status == 500 and reply["error"]["code"] == "model_load_failed", reply
    assert "bad-config/config.json is not valid JSON" in reply["error"]["message"], reply
    assert str(server.log_path.parent) not in reply["error"]["message"], reply
    assert str(server.log_path.parent) in server.log()  # (the log keeps the whole path)


def test_sigterm_ends_the_server_while_a_render_is_stuck(tmp_path):
    with ServeProcess(tmp_path, "--models-dir", str(models_dir(tmp_path)), "--max-models", "2") as server:
        stuck = threading.Thread(target=chat, args=(server, "spin-template", "spin"), daemon=True)
        stuck.start()
        poll_until(lambda: "loaded spin-template" in server.log())
        time.sleep(0.5)  # the render of "spin" starts right after the load (a good render takes milliseconds)
        start = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=30)
        assert time.monotonic() - start < EXIT_S


def properties(count: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 3} for i in range(count)}}


def json_format(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}


def test_three_huge_schemas_beside_a_stream_neither_stall_it_nor_health(server):
    gaps: list[float] = []
    results: list[tuple[int, dict]] = []
    # The body made and encoded before the stream starts: the stream's reader in this process then does not
    # wait for the senders' own JSON work (a loaded suite once read that as a 1.5 s gap).
    body = json.dumps({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello."}],
                       **NO_THINK, **json_format(properties(10_000))}).encode()

    def send() -> None:
        status, _, reply = http("POST", server.url + CHAT, body, timeout=60)
        results.append((status, reply))

    senders = [threading.Thread(target=send) for _ in range(3)]
    stream = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count."}], stream=True, max_tokens=3000,
        extra_body={**NO_THINK, "ignore_eos": True})
    with HealthWatch(server) as health:
        last = None
        for chunk in stream:
            if not (chunk.choices and chunk.choices[0].delta.content):
                continue  # (the role chunk comes before the prompt is read: gaps count between tokens)
            now = time.monotonic()
            if last is None:
                for sender in senders:
                    sender.start()
            else:
                gaps.append(now - last)
            last = now
            if all(not s.is_alive() for s in senders) and len(gaps) > 10:
                break
        stream.close()
        for sender in senders:
            sender.join()
    assert len(results) == 3
    for status, reply in results:
        assert status == 400 and "properties" in reply["error"]["message"] or status == 200, reply
    assert max(gaps) < GAP_S, max(gaps)
    assert health.slowest < HEALTH_S, health.slowest


RECURSIVE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
OVERLAPPING = {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}


@pytest.mark.parametrize(("schema", "named"), [
    (RECURSIVE, "$ref '#/$defs/a'"), ({"const": "x" * 2_000_000}, "const"), (properties(15_000), "properties"),
    ({"type": "integer", "minimum": -10**30}, "/minimum"), (OVERLAPPING, "oneOf"),
    ({"type": "object", "not": {}}, "not")], ids=["ref", "const", "properties", "minimum", "oneOf", "not"])
def test_a_schema_the_grammar_cannot_take_is_a_short_400_naming_it(server, schema, named):
    before = server.metrics()["mlxchat_requests_failed_total"]
    log_before = len(server.log())
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi."}], **NO_THINK,
            **json_format(schema)}
    status, _, reply = http("POST", server.url + CHAT, json.dumps(body).encode(), timeout=60)
    assert status == 400, reply
    assert named in reply["error"]["message"] and len(json.dumps(reply)) < 2048, reply
    assert "coerce_one_of" not in reply["error"]["message"]
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    status, _, called = http("POST", server.url + CHAT, {**body, "response_format": None, "tools": tools,
                                                        "tool_choice": "required"}, timeout=60)
    assert status == 400 and named in called["error"]["message"] and len(json.dumps(called)) < 2048, called
    assert server.metrics()["mlxchat_requests_failed_total"] == before
    assert len(server.log()) - log_before < 8_000  # no schema echoed whole
    assert normal_reply(server) == server.reference

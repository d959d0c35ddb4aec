"""A real `mlxchat serve` process on a loopback port, for the serve tests (as users run it).

``ServeProcess`` starts it, waits until ``/health`` answers (polling, bounded),
and stops it; its stderr (one log line per request) is kept for the tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from process_watch import HANG_S

ROOT = Path(__file__).resolve().parent.parent
PAIR = ("--model", "mini-target", "--draft", "mini-draft")
MODEL = "mini-target"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", "serve", *args]


def poll_until(condition, limit: float = HANG_S, every: float = 0.01) -> float:
    """Seconds until ``condition()`` came true; fails after ``limit`` seconds."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < limit, f"not true after {limit} s: {condition}"
        time.sleep(every)
    return time.monotonic() - start


def http(method: str, url: str, body: object = None, headers: dict | None = None,
         timeout: float = 30) -> tuple[int, dict, object]:
    """(status, headers, JSON or text) of one request, whatever the status."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            status, head, raw = reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        status, head, raw = error.code, dict(error.headers), error.read()
    try:
        return status, head, json.loads(raw)
    except ValueError:
        return status, head, raw.decode(errors="replace")


class ServeProcess:
    """`mlxchat serve` on a free loopback port; a context manager."""

    def __init__(self, tmp: Path, *args: str, pair: tuple[str, ...] = PAIR, script: str | None = None,
                 env: dict[str, str] | None = None, api_key: str | None = None, home: Path | None = None) -> None:
        """``script``: a helper in tests/ to run instead of `mlxchat serve` (same options); ``env``: added to it;
        ``api_key``: served with --api-key, which ``client`` and ``metrics`` send; ``home``: its MLXCHAT_HOME
        (the session store's parent; default: ``tmp/home``)."""
        self.api_key = api_key
        args = (*args, "--api-key", api_key) if api_key else args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = home or tmp / "home"
        self.log_path = tmp / f"serve-{self.port}.log"
        options = ("--port", str(self.port), *pair, *args)
        self.command = [sys.executable, str(ROOT / "tests" / script), *options] if script else serve_command(*options)
        self.env = env or {}
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServeProcess:
        env = dict(os.environ, HF_HUB_OFFLINE="1", MLXCHAT_HOME=str(self.home), **self.env)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.wait_healthy()
        return self

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"mlxchat serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                if http("GET", f"{self.url}/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.05)
        raise AssertionError(f"mlxchat serve did not become healthy in {HANG_S} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kwargs):
        import openai
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kwargs.pop("api_key", self.api_key or "none"),
                             max_retries=0,
                             timeout=kwargs.pop("timeout", 60), **kwargs)

    def anthropic(self, **kwargs):
        """The official ``anthropic`` client on this server (``x-api-key``; ``auth_token=`` sends a bearer key)."""
        import anthropic
        if "auth_token" not in kwargs:
            kwargs.setdefault("api_key", self.api_key or "none")
        return anthropic.Anthropic(base_url=self.url, max_retries=0, timeout=kwargs.pop("timeout", 60), **kwargs)

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {sample name with labels: value}."""
        key = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        status, _, text = http("GET", f"{self.url}/metrics", headers=key)
        assert status == 200, text
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def __exit__(self, *exc) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=15)


NORMAL_QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


def normal_reply(server: ServeProcess) -> str:
    """A greedy reply to a plain question (thinking off), through the official openai client."""
    reply = server.client().chat.completions.create(
        model=MODEL, messages=NORMAL_QUESTION, temperature=0, max_tokens=24,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].finish_reason in ("stop", "length"), reply
    return reply.choices[0].message.content


def assert_still_serves(server: ServeProcess, reference: str, held_blocks: int = 0) -> None:
    """After whatever a test did: the server answers a normal request as it did fresh (``reference``, its
    greedy reply then), and its pool goes back to idle: nothing running or waiting, no block held but
    ``held_blocks`` (restored sessions that stay pinned)."""
    assert server.process.poll() is None, f"the server exited:\n{server.log()}"
    status, _, health = http("GET", f"{server.url}/health")
    assert status == 200, health
    assert normal_reply(server) == reference

    def idle() -> bool:
        now = server.metrics()
        return now["mlxchat_running_requests"] == 0 and now["mlxchat_queue_length"] == 0 and \
            now["mlxchat_pool_used_blocks"] == held_blocks

    poll_until(idle, every=0.05)


def assert_freed_after_close(server, before: dict, limit: float = 1.0) -> None:
    """A stream closed just now: within ``limit`` seconds its request counts as cancelled and the pool holds
    the blocks it held before the request (``before``: ``server.metrics()`` then)."""
    gone = time.monotonic()

    def freed() -> bool:
        now = server.metrics()
        return now["mlxchat_requests_cancelled_total"] == before["mlxchat_requests_cancelled_total"] + 1 and \
            now["mlxchat_pool_used_blocks"] == before["mlxchat_pool_used_blocks"]
    poll_until(freed, limit=5)
    assert time.monotonic() - gone < limit


def inject_fault(server, fault: Path, content: str, running: int = 1) -> None:
    """Make serve_slow_server.py's steps fail once ``running`` requests are in the batch (a request still
    waiting is not one a failing step ran: it goes on). The file appears whole (renamed into place): a step
    that read it half-written would take "once" for "always"."""
    poll_until(lambda: server.metrics()["mlxchat_running_requests"] >= running)
    partial = fault.with_name(fault.name + ".part")
    partial.write_text(content)
    os.replace(partial, fault)


def scripted_server(tmp: Path, rules) -> ServeProcess:
    """A server whose replies follow ``rules`` (tests/serve_scripted.py: prompts matched to the replies the
    batch runner's masks force), on the embedded target without a draft; use it as a context manager."""
    script = tmp / "script.json"
    script.write_text(json.dumps(rules))
    return ServeProcess(tmp, pair=("--model", MODEL, "--no-draft"), script="serve_scripted.py",
                        env={"MLXCHAT_TEST_SCRIPT": str(script)})

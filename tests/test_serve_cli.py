"""`mlxchat serve` on the command line: bad options, and binding beyond loopback without an API key."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from serve_process import ROOT, free_port, http

from app.cli import main
from app.serve.command import is_loopback


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "serve", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))


def test_binding_beyond_loopback_without_a_key_warns():
    port = free_port()
    done = serve("--host", "0.0.0.0", "--port", str(port), "--model", "no-such-model")  # fails before binding
    assert "warning: listening on 0.0.0.0 without --api-key" in done.stderr
    assert done.returncode == 2 and "Unknown model 'no-such-model'" in done.stderr and "Traceback" not in done.stderr
    try:
        http("GET", f"http://127.0.0.1:{port}/health", timeout=1)
        raise AssertionError("nothing may be listening after a failed start")
    except OSError:
        pass


def test_bad_options_are_one_line_and_status_2(capsys):
    for args, words in ((("--port", "0"), "--port must be at least 1"),
                        (("--max-waiting", "0"), "--max-waiting must be at least 1"),
                        (("--kv", "rotating"), "batches requests on the paged KV cache"),
                        (("--temp", "-1"), "temperature must be 0")):
        assert main(["serve", *args]) == 2  # refused before any model loads
        stderr = capsys.readouterr().err
        assert words in stderr and stderr.count("\n") == 1, stderr


def test_loopback_addresses():
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "127.0.0.2"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.2", "example.com"))


def test_a_port_in_use_is_one_message_and_status_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = serve("--port", str(taken.getsockname()[1]), "--model", "mini-target", "--no-draft")
    assert done.returncode == 2 and "Cannot listen on 127.0.0.1" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "serving" not in done.stderr

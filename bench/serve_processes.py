"""Server processes for the bench: `mlxchat serve` and `mlx_lm.server`, on free loopback ports.

Both get the same optimized BLAS (``import mlxcore`` before MLX, as mlxchat's
own processes do), so that the bench compares servers, not BLAS libraries.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 180.0
# mlx_lm.server's own entry point, in a process that loaded the optimized BLAS first.
MLX_LM_SERVER = "import mlxcore, sys; from mlx_lm.server import main; sys.argv[0] = 'mlx_lm.server'; main()"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server started with ``command`` (``{port}`` filled in), ready once ``/health`` answers; a context manager."""

    def __init__(self, command: list[str], model: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model  # what requests send as "model"; None: the first of /v1/models
        self.command = [part.format(port=self.port) for part in command]
        self._log = tempfile.TemporaryFile()
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"{' '.join(self.command[:4])}... did not start:\n{self.log()[-2000:]}")
            time.sleep(0.1)
        if self.model is None:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=10) as reply:
                self.model = json.load(reply)["data"][0]["id"]
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def mlxchat_server(model: str, draft: str | None, *extra: str) -> ServerProcess:
    pair = ["--model", model] + (["--draft", draft] if draft else ["--no-draft"])
    return ServerProcess([sys.executable, "-m", "app.cli", "serve", "--port", "{port}", *pair, *extra])


def mlx_lm_server(folder: Path) -> ServerProcess:
    return ServerProcess([sys.executable, "-c", MLX_LM_SERVER, "--model", str(folder), "--port", "{port}",
                          "--log-level", "WARNING"], "default_model")

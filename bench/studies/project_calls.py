"""Python calls into the project per generated token: issue 58's measure of how much Python a token costs.

Counted as a profiler counts them: every call of a Python function whose code is in this project's
``mlxcore/``, ``sessions/`` or ``app/`` (a generator's resumption counts as a call, as cProfile counts it),
in every thread. The figure is marginal: the calls of replies of ``2 N`` tokens less those of ``N``,
divided by the extra tokens, so start-up, the prompt and the first token do not count. Greedy, on the
float32 0.6B twin, 28 layers (random weights: it never stops early; ``ignore_eos`` where the API has it).

- ``ask``: ``mlxchat ask`` in this process (its command line, ``ChatSession`` and the engine), no draft.
- ``serve``: ``mlxchat serve`` in a child process that counts its own calls, 8 streaming clients at once
  (the openai package), each reply ``N`` then ``2 N`` tokens.

Run from the project's root: ``.venv/bin/python bench/studies/project_calls.py [ask|serve|both] [N] [TWIN]``
(TWIN: a name of ``bench/twin_specs.py``; two twins of different depths split the figure into a part per
layer and a part per token).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OURS = tuple(str(ROOT / part) + os.sep for part in ("mlxcore", "sessions", "app"))
CLIENTS = 8


class CallCounter:
    """Counts calls into the project's files, in every thread started after ``start`` and in this one."""

    def __init__(self) -> None:
        self.calls = 0

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(OURS):
            self.calls += 1  # (a lost update between threads is one call in millions)

    def start(self) -> None:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)


def _twin(name: str) -> str:
    from bench.twins import twin_folder

    return str(twin_folder(name, bits=None))


# --- ask ---------------------------------------------------------------------

def ask_calls(model: str, tokens: int) -> tuple[int, int]:
    """(calls, tokens generated) of one ``mlxchat ask`` of ``tokens`` tokens, greedy, in this process."""
    from app.cli import main

    argv = ["ask", "--model", model, "--no-draft", "--no-think", "--temp", "0", "--max-tokens", str(tokens),
            "--json", "Tell me a story."]
    counter, out = CallCounter(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        counter.start()
        try:
            main(argv)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    generated = sum(1 for line in out.getvalue().splitlines() if '"token"' in line)
    return counter.calls, generated


def marginal_ask(model: str, n: int) -> dict:
    ask_calls(model, 4)  # warm-up: imports, compiled kernels
    short, long = ask_calls(model, n), ask_calls(model, 2 * n)
    return {"calls_per_token": (long[0] - short[0]) / max(long[1] - short[1], 1), "tokens": (short[1], long[1])}


# --- serve -------------------------------------------------------------------

def _child(dump: str, argv: list[str]) -> None:
    """``mlxchat serve`` counting its own calls; SIGUSR1 writes the count so far to ``dump``."""
    from app.cli import main

    counter = CallCounter()

    def write(signum: int, frame: FrameType | None) -> None:
        Path(dump).write_text(str(counter.calls))

    signal.signal(signal.SIGUSR1, write)
    counter.start()
    sys.exit(main(argv))


def _count(child: subprocess.Popen, dump: Path) -> int:
    dump.unlink(missing_ok=True)
    child.send_signal(signal.SIGUSR1)
    for _ in range(200):
        if dump.exists() and dump.read_text():
            return int(dump.read_text())
        time.sleep(0.05)
    raise RuntimeError("the server did not report its count")


def _round(port: int, tokens: int) -> int:
    """8 streaming clients at once, ``tokens`` each; tokens generated in all."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=600)
    model = client.models.list().data[0].id

    def one(i: int) -> int:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Tell me story {i}."}], max_tokens=tokens,
            temperature=0, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        usage = [chunk.usage for chunk in stream if chunk.usage is not None]
        return usage[-1].completion_tokens if usage else 0

    with ThreadPoolExecutor(CLIENTS) as pool:
        return sum(pool.map(one, range(CLIENTS)))


def marginal_serve(model: str, n: int, port: int = 18731) -> dict:
    import urllib.request

    dump = Path(tempfile.mkdtemp()) / "calls"
    argv = ["serve", "--model", model, "--no-draft", "--no-think", "--port", str(port), "--max-running", str(CLIENTS)]
    child = subprocess.Popen([sys.executable, __file__, "--child", str(dump), json.dumps(argv)], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            time.sleep(0.2)
        _round(port, 4)  # warm-up
        before = _count(child, dump)
        short = _round(port, n)
        middle = _count(child, dump)
        long = _round(port, 2 * n)
        after = _count(child, dump)
    finally:
        child.terminate()
        child.wait(30)
    return {"calls_per_token": ((after - middle) - (middle - before)) / max(long - short, 1),
            "tokens": (short, long)}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], json.loads(sys.argv[3]))
        return
    which = sys.argv[1] if len(sys.argv) > 1 else "both"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    model = _twin(sys.argv[3] if len(sys.argv) > 3 else "qwen3-0.6b")
    if which in ("ask", "both"):
        print("ask", marginal_ask(model, n), flush=True)
    if which in ("serve", "both"):
        print(f"serve, {CLIENTS} clients", marginal_serve(model, n), flush=True)


if __name__ == "__main__":
    main()

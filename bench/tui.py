"""Bench row `tui_decode_vs_headless`: decode speed while the TUI streams a long reply, over `mlxchat ask`'s.

Both sides generate the same reply to the same prompt (60 earlier messages and
a question, greedy, end-of-text ignored so that the reply is ``reply_tokens``
long), back to back in one run; the value is the median of the paired ratios.
Each run is a new process, as users start `mlxchat ask` and `mlxchat`: a
headless run in the bench's own process, after TUI runs there, measured ~11%
slower than in a new one, and the bench's process carries whatever the rows
before this one left in it.
The TUI side also reports how long after the last token the reply was complete
on screen, and the worst event-loop stall while it streamed (a key press waits
at most that long).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from app.engine_host.protocol import Open
from app.engine_host.reply_stream import FLUSH_SECONDS

QUESTION = "Tell me a long story about a lighthouse keeper."
SIZE = (120, 40)


def earlier_messages(count: int = 60) -> tuple[tuple[str, str], ...]:
    """A chat of ``count`` short messages with some Markdown (lists, code), as users have on screen."""
    messages = []
    for i in range(count // 2):
        messages.append(("user", f"Question {i}: what does step {i} do?"))
        body = f"Step {i} adds **{i}** to the total.\n\n- first it reads\n- then it adds"
        if i % 5 == 0:
            body += f"\n\n```python\ntotal += {i}\n```"
        messages.append(("assistant", body))
    return tuple(messages)


@contextlib.contextmanager
def scratch_home() -> Iterator[str]:
    """MLXCHAT_HOME pointed at a temporary folder, so the chats the TUI autosaves stay out of the user's store."""
    previous = os.environ.get("MLXCHAT_HOME")
    with tempfile.TemporaryDirectory(prefix="mlxchat-bench-") as folder:
        os.environ["MLXCHAT_HOME"] = folder  # the engine process inherits it
        try:
            yield folder
        finally:
            if previous is None:
                os.environ.pop("MLXCHAT_HOME", None)
            else:
                os.environ["MLXCHAT_HOME"] = previous


def headless_decode(engine: Any, messages: tuple[tuple[str, str], ...], params: Any) -> dict[str, float]:
    """`mlxchat ask`'s path: a ChatSession holding ``messages``, the question streamed as text to a sink."""
    from app.ask import print_text
    from sessions.chat_session import ChatSession
    from sessions.messages import Message

    session = ChatSession(engine, params=params)
    session.messages = [Message(role, content) for role, content in messages]
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        events = session.stream_events(QUESTION)
        try:
            print_text(events, show_thinking=True)
        finally:
            events.close()
    session.caches.release()
    stats = session.last_stats
    return {"decode_tps": stats.decode_tps, "decode_seconds": stats.decode_seconds, "tokens": stats.generated_tokens}


class StallMeter:
    """The worst lateness of a 10 ms timer on the running event loop, counted while ``active()`` holds."""

    def __init__(self, active: Any, period: float = 0.01) -> None:
        self.active, self.period = active, period
        self.worst, self.late_100ms, self.ticks = 0.0, 0, 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            counting = self.active()
            start = time.perf_counter()
            await asyncio.sleep(self.period)
            if counting and self.active():
                late = time.perf_counter() - start - self.period
                self.worst = max(self.worst, late)
                self.late_100ms += late > 0.1
                self.ticks += 1

    def stop(self) -> float:
        self._task.cancel()
        return self.worst


async def tui_run(command: Open, mode: str, timeout: float = 600.0) -> dict[str, float]:
    """One TUI reply: decode tok/s (engine's figure), completion lag and worst stall while streaming; ``mode``
    "process" is the window as shipped, "thread" its engine on a thread of this process (``pace`` first)."""
    from app.tui.app import ChatApp

    app = ChatApp(command)
    if mode == "thread":
        from bench.tui_engine import ThreadEngineClient
        app.client = ThreadEngineClient(app.client.on_event)
    elif mode != "process":
        raise ValueError(f"the TUI side runs in mode 'process' or 'thread', not {mode!r}")
    async with app.run_test(size=SIZE) as pilot:
        deadline = time.monotonic() + timeout
        while not (app.ready and app.state is not None):
            await _tick(pilot, deadline)
        meter = StallMeter(lambda: app.generating)
        meter.start()
        cpu, wall = time.process_time(), time.perf_counter()
        app.prompt.load_text(QUESTION)
        await pilot.press("enter")
        while app.replies_done < 1:
            await _tick(pilot, deadline)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        worst = meter.stop()
        while app.updates <= app.updates_at_done:  # the saved chat arrived: nothing left in flight
            await _tick(pilot, deadline)
        stats = app.status.stats
        return {"decode_tps": stats["decode_tps"], "decode_seconds": stats["decode_seconds"],
                "lag_s": app.completion_lags[-1],
                "stall_s": worst, "stalls_over_100ms": meter.late_100ms, "ui_cpu_share": cpu / wall,
                "tokens": stats["generated_tokens"], "mounted_messages": len(app.chat.views)}


def engine_only_run(command: Open, timeout: float = 600.0) -> dict[str, float]:
    """The control: the TUI's engine process generating the same reply with no UI (events are dropped).

    Paired against `mlxchat ask`'s path like the TUI, it shows what the measurement gives when
    nothing renders: the host's own noise and any cost of the engine process itself.
    """
    import threading

    from app.engine_host import protocol as p
    from app.tui.engine_client import EngineClient

    ready, done, seen = threading.Event(), threading.Event(), {}

    def on_event(event: Any) -> None:
        if isinstance(event, (p.Ready, p.Failure)):
            seen.setdefault("first", event)
            ready.set()
        if isinstance(event, (p.Done, p.Failure)):
            seen["last"] = event
            done.set()

    client = EngineClient(on_event)
    client.start()
    try:
        client.send(command)
        if not ready.wait(timeout) or isinstance(seen["first"], p.Failure):
            raise RuntimeError(f"the engine did not open: {seen.get('first')}")
        client.send(p.Send(QUESTION))
        if not done.wait(timeout) or isinstance(seen["last"], p.Failure):
            raise RuntimeError(f"the engine did not answer: {seen.get('last')}")
    finally:
        client.close()
    stats = seen["last"].stats
    return {"decode_tps": stats["decode_tps"], "decode_seconds": stats["decode_seconds"], "lag_s": 0.0,
            "stall_s": 0.0, "stalls_over_100ms": 0,
            "ui_cpu_share": 0.0, "tokens": stats["generated_tokens"], "mounted_messages": 0}


async def _tick(pilot: Any, deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError("the TUI benchmark did not finish in time")
    await asyncio.sleep(0.05)  # not pilot.pause: the harness should not add work to the UI


@dataclass(frozen=True)
class Workload:
    """The reply both sides generate: greedy, end-of-text ignored, after ``earlier`` messages."""

    model: str = "mini-target"
    draft: str | None = "mini-draft"
    reply_tokens: int = 2000
    earlier: int = 60
    flush_seconds: float = FLUSH_SECONDS  # how often the engine sends text to the UI

    def open_command(self) -> Open:
        return Open(model=self.model, draft=self.draft, no_draft=self.draft is None,
                    params={"temperature": 0.0, "max_tokens": self.reply_tokens, "ignore_eos": True},
                    messages=earlier_messages(self.earlier))

    def pace(self) -> None:
        """The engines this process starts from now on (in a child process or on a thread) send text to the
        UI every ``flush_seconds``."""
        from functools import partial

        from app.engine_host import reply_stream
        from app.tui import engine_client
        from bench.tui_engine import paced_engine_process

        reply_stream.FLUSH_SECONDS = self.flush_seconds  # for an engine on a thread of this process
        engine_client.run_engine_process = partial(paced_engine_process, self.flush_seconds)


def run_side(side: str, workload: Workload) -> dict[str, float]:
    """One reply on one side, in this process: "headless" (`mlxchat ask`'s path), "process" (the TUI
    as shipped), "thread" (its engine on a thread of the UI process) or "none" (the engine, no UI)."""
    if side == "headless":
        return _headless_run(workload)
    workload.pace()
    if side == "none":
        return engine_only_run(workload.open_command())
    return asyncio.run(tui_run(workload.open_command(), side))


def side_in_new_process(side: str, workload: Workload) -> dict[str, float]:
    """``run_side`` in a new Python process, as users start `mlxchat ask` and `mlxchat`.

    Nothing an earlier run left in a process (loaded models, a grown heap, threads) is on
    either side: a headless run in the bench's own process measured ~11% slower after TUI runs there.
    """
    argv = [sys.executable, "-m", "bench.tui", "--side", side, json.dumps(asdict(workload))]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the {side} side failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _headless_run(workload: Workload) -> dict[str, float]:
    from mlxcore.launch import ModelChoice, open_engine
    from mlxcore.params import GenerationParams

    choice = ModelChoice(workload.model, workload.draft, no_draft=workload.draft is None)
    engine = open_engine(choice).engine
    engine.eos_ids = set()  # the same long reply on both sides
    params = GenerationParams(temperature=0.0, max_tokens=workload.reply_tokens)
    return headless_decode(engine, earlier_messages(workload.earlier), params)


def tui_decode_vs_headless(runs: int = 5, mode: str = "process", workload: Workload = Workload()) -> dict[str, Any]:
    """Run the paired measurement; "value" is the median ratio TUI decode tok/s / headless decode tok/s.

    ``mode`` "process" is the TUI as shipped; "thread" runs the same engine host on a thread of the UI
    process, and a ``workload`` with ``flush_seconds`` 0 sends every token, for comparing the designs;
    "none" is the control with no UI at all (`engine_only_run`). Each run is a new process.
    """
    pairs = []
    with scratch_home():
        for run in range(runs):  # alternate the order: other load on the machine drifts over time
            order = ("headless", mode) if run % 2 == 0 else (mode, "headless")
            sides = {side: side_in_new_process(side, workload) for side in order}
            pairs.append((sides["headless"]["decode_tps"], sides[mode]))
    ratios = [t["decode_tps"] / h for h, t in pairs]
    return {"value": statistics.median(ratios), "ratios": ratios, "mode": mode,
            "pairs_tps": [(round(h, 1), round(t["decode_tps"], 1)) for h, t in pairs],  # (headless, TUI), in run order
            "headless_tps": statistics.median(h for h, _ in pairs),
            "tui_tps": statistics.median(t["decode_tps"] for _, t in pairs),
            "completion_lag_s": max(t["lag_s"] for _, t in pairs),
            "worst_stall_s": max(t["stall_s"] for _, t in pairs),
            "stalls_over_100ms": sum(t["stalls_over_100ms"] for _, t in pairs),
            "ui_cpu_share": statistics.median(t["ui_cpu_share"] for _, t in pairs),
            "reply_tokens": min(t["tokens"] for _, t in pairs), "earlier_messages": workload.earlier,
            "flush_seconds": workload.flush_seconds,
            "mounted_messages": pairs[-1][1]["mounted_messages"]}


if __name__ == "__main__":  # python -m bench.tui [process|thread|none[:FLUSH_SECONDS]] ...
    if sys.argv[1:2] == ["--side"]:
        print(json.dumps(run_side(sys.argv[2], Workload(**json.loads(sys.argv[3])))))
        sys.exit()
    for spec in sys.argv[1:] or ["process"]:
        chosen, _, flush = spec.partition(":")
        result = tui_decode_vs_headless(mode=chosen, workload=Workload(flush_seconds=float(flush or FLUSH_SECONDS)))
        print(json.dumps(result), flush=True)

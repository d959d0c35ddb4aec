"""Bench row `tui_decode_vs_headless`: decode speed while the TUI streams a long reply, over `mlxchat ask`'s.

Both sides generate the same reply to the same prompt (60 earlier messages and
a question, greedy, end-of-text ignored so that the reply is ``reply_tokens``
long), back to back in one run; the value is the median of the paired ratios.
Each side runs in a fresh process, as `mlxchat ask` and the TUI's engine do: a
headless run in the bench's own process, after TUI runs there, measured ~11%
slower than in a new one, which flattered the TUI.
The TUI side also reports how long after the last token the reply was complete
on screen, and the worst event-loop stall while it streamed (a key press waits
at most that long).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from app.tui.protocol import FLUSH_SECONDS, Open

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


def headless_decode_tps(engine: Any, messages: tuple[tuple[str, str], ...], params: Any) -> float:
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
    return session.last_stats.decode_tps


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
    """One TUI reply: decode tok/s (engine's figure), completion lag and worst stall while streaming."""
    from app.tui.app import ChatApp

    app = ChatApp(command, engine_mode=mode)
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
        return {"decode_tps": app.status.stats["decode_tps"], "lag_s": app.completion_lags[-1],
                "stall_s": worst, "stalls_over_100ms": meter.late_100ms, "ui_cpu_share": cpu / wall,
                "tokens": app.status.stats["generated_tokens"], "mounted_messages": len(app.chat.views)}


def engine_only_run(command: Open, timeout: float = 600.0) -> dict[str, float]:
    """The control: the TUI's engine process generating the same reply with no UI (events are dropped).

    Paired against `mlxchat ask`'s path like the TUI, it shows what the measurement gives when
    nothing renders: the host's own noise and any cost of the engine process itself.
    """
    import threading

    from app.tui import protocol as p
    from app.tui.engine_client import EngineClient

    ready, done, seen = threading.Event(), threading.Event(), {}

    def on_event(event: Any) -> None:
        if isinstance(event, (p.Ready, p.Failure)):
            seen.setdefault("first", event)
            ready.set()
        if isinstance(event, (p.Done, p.Failure)):
            seen["last"] = event
            done.set()

    client = EngineClient(on_event, mode="process")
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
    return {"decode_tps": stats["decode_tps"], "lag_s": 0.0, "stall_s": 0.0, "stalls_over_100ms": 0,
            "ui_cpu_share": 0.0, "tokens": stats["generated_tokens"], "mounted_messages": 0}


async def _tick(pilot: Any, deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError("the TUI benchmark did not finish in time")
    await asyncio.sleep(0.05)  # not pilot.pause: the harness should not add work to the UI


def headless_in_new_process(model: str, draft: str | None, reply_tokens: int, earlier: int) -> float:
    """`headless_decode_tps` in a new Python process (``python -m app.tui_bench --headless ...``)."""
    argv = [sys.executable, "-m", "app.tui_bench", "--headless", model, draft or "", str(reply_tokens), str(earlier)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _headless_main(model: str, draft: str, reply_tokens: str, earlier: str) -> None:
    from mlxcore.launch import ModelChoice, open_engine
    from mlxcore.params import GenerationParams

    engine = open_engine(ModelChoice(model, draft or None, no_draft=not draft)).engine
    engine.eos_ids = set()  # the same long reply on both sides
    params = GenerationParams(temperature=0.0, max_tokens=int(reply_tokens))
    print(headless_decode_tps(engine, earlier_messages(int(earlier)), params))


def tui_decode_vs_headless(runs: int = 5, reply_tokens: int = 2000, earlier: int = 60, mode: str = "process",
                           model: str = "mini-target", draft: str | None = "mini-draft",
                           flush_seconds: float = FLUSH_SECONDS) -> dict[str, Any]:
    """Run the paired measurement; "value" is the median ratio TUI decode tok/s / headless decode tok/s.

    ``mode`` "process" is the TUI as shipped; "thread" runs the same engine host on a thread of the UI
    process, and ``flush_seconds`` 0 sends every token, for comparing the designs; "none" is the
    control with no UI at all (`engine_only_run`).
    """
    history = earlier_messages(earlier)
    command = Open(model=model, draft=draft, no_draft=draft is None, params={"temperature": 0.0,
                   "max_tokens": reply_tokens}, messages=history, ignore_eos=True, flush_seconds=flush_seconds)

    def side_run() -> dict[str, float]:
        return engine_only_run(command) if mode == "none" else asyncio.run(tui_run(command, mode))

    pairs = []
    with scratch_home():
        for run in range(runs):  # alternate the order: other load on the machine drifts over time
            if run % 2:
                tui = side_run()
                headless = headless_in_new_process(model, draft, reply_tokens, earlier)
            else:
                headless = headless_in_new_process(model, draft, reply_tokens, earlier)
                tui = side_run()
            pairs.append((headless, tui))
    ratios = [t["decode_tps"] / h for h, t in pairs]
    return {"value": statistics.median(ratios), "ratios": ratios, "mode": mode,
            "pairs_tps": [(round(h, 1), round(t["decode_tps"], 1)) for h, t in pairs],  # (headless, TUI), in run order
            "headless_tps": statistics.median(h for h, _ in pairs),
            "tui_tps": statistics.median(t["decode_tps"] for _, t in pairs),
            "completion_lag_s": max(t["lag_s"] for _, t in pairs),
            "worst_stall_s": max(t["stall_s"] for _, t in pairs),
            "stalls_over_100ms": sum(t["stalls_over_100ms"] for _, t in pairs),
            "ui_cpu_share": statistics.median(t["ui_cpu_share"] for _, t in pairs),
            "reply_tokens": min(t["tokens"] for _, t in pairs), "earlier_messages": earlier,
            "flush_seconds": command.flush_seconds,
            "mounted_messages": pairs[-1][1]["mounted_messages"]}


if __name__ == "__main__":  # python -m app.tui_bench [process|thread|none[:FLUSH_SECONDS]] ...
    import json

    if sys.argv[1:2] == ["--headless"]:
        _headless_main(*sys.argv[2:6])
        sys.exit()
    for spec in sys.argv[1:] or ["process"]:
        chosen, _, flush = spec.partition(":")
        print(json.dumps(tui_decode_vs_headless(mode=chosen, flush_seconds=float(flush or FLUSH_SECONDS))), flush=True)

"""The status line: what the engine is doing and the speed figures of the last (or current) reply."""

from __future__ import annotations

import time
from collections.abc import Mapping

from textual.widgets import Static

# Timings, speeds, ages and memory on screen. Snapshot tests turn them off: a picture must not depend on them.
SHOW_FIGURES = True


def _si(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def stats_text(stats: Mapping[str, object]) -> str:
    """One line of figures: prefill and decode speed, draft acceptance, cache reuse, context, memory."""
    def figure(key: str) -> float:  # a figure the reply's stats lack (or hold as something else) reads 0
        value = stats.get(key)
        return value if isinstance(value, (int, float)) else 0.0
    parts = [f"prefill {figure('prefill_tps'):.0f} · decode {figure('decode_tps'):.1f} tok/s"]
    if figure("draft_proposed"):  # which drafter ran: prompt lookup, a block drafter, the draft model, or
        # one of the last two with prompt lookup beside it ("NAME+lookup", ``drafters.LookupFirst``)
        name = str(stats.get("drafter") or "")
        own, beside = name.removesuffix("+lookup"), "+lookup" if name.endswith("+lookup") else ""
        drafter = (own if own in ("lookup", "block") else "draft") + beside
        parts.append(f"{drafter} {100 * figure('acceptance'):.0f}%")
    disk = f" ({_si(figure('disk_reused_tokens'))} from disk)" if figure("disk_reused_tokens") else ""
    parts.append(f"reused {_si(figure('reused_tokens'))}/{_si(figure('prompt_tokens'))}{disk}")
    used, limit = figure("prompt_tokens") + figure("generated_tokens"), figure("context_length")
    parts.append(f"ctx {_si(used)}" + (f"/{_si(limit)}" if limit else ""))
    parts.append(f"{figure('peak_memory_bytes') / 2**20:.0f} MB")
    if figure("kv_budget_bytes"):
        parts.append(f"KV {_size(figure('kv_bytes'))}/{_size(figure('kv_budget_bytes'))}")
    return " · ".join(parts)


class StatusLine(Static):
    """Shows the engine state, and its figures unless ``SHOW_FIGURES`` is off."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("Starting…", id=id, markup=False)  # model, server and tool names are no markup
        self.model = ""
        self.warning = ""  # what stays said while idle (an MCP server that did not start)
        self.stats: Mapping[str, object] = {}
        self._started = 0.0
        self._tokens = 0

    def show_note(self, what: str) -> None:
        self.update(what)

    def generating_started(self, replies: int = 1) -> None:
        self._started, self._tokens = time.monotonic(), 0
        what = "generating…" if replies == 1 else f"generating {replies} replies side by side…"
        self.update(f"{self.model} · {what} (Esc stops)")

    def picking(self, replies: int) -> None:
        """Replies side by side have ended: the user keeps one."""
        self.update(f"{self.model} · keep one reply: 1-{replies}, or click Keep")

    def prefilling(self, done: int, total: int) -> None:
        """The prompt is being read (a long prompt, or a chat whose cache is rebuilt)."""
        if not SHOW_FIGURES:
            return
        self.update(f"{self.model} · reading the prompt… {_si(done)}/{_si(total)} tokens (Esc stops)",
                    layout=False)

    def generating_progress(self, tokens: int) -> None:
        """Live speed while a reply streams (text pieces per second, about tokens per second)."""
        self._tokens += tokens
        if not SHOW_FIGURES:
            return
        elapsed = max(time.monotonic() - self._started, 1e-6)
        self.update(f"{self.model} · generating… {self._tokens} tokens, {self._tokens / elapsed:.1f} tok/s "
                    "(Esc stops)", layout=False)  # one row, always: no layout pass for the whole screen

    def finished(self, stats: Mapping[str, object], reason: str) -> None:
        self.stats = stats
        self.show_idle(reason)

    def show_idle(self, reason: str = "") -> None:
        label = {"stopped": "stopped", "length": "max tokens reached", "error": "failed",
                 "cut while thinking": "cut off while thinking: no answer (raise max tokens, f10)"}.get(reason, "")
        figures = stats_text(self.stats) if self.stats and SHOW_FIGURES else ""
        lead = "" if figures else self.model  # the header names the model; the figures need the room
        self.update(" · ".join(x for x in (lead, label, self.warning, figures) if x) or "Ready")

"""The status line: what the engine is doing and the speed figures of the last (or current) reply."""

from __future__ import annotations

import time
from typing import Any

from textual.widgets import Static

# Timings, speeds, ages and memory on screen. Snapshot tests turn them off: a picture must not depend on them.
SHOW_FIGURES = True


def _si(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def stats_text(stats: dict[str, Any]) -> str:
    """One line of figures: prefill and decode speed, draft acceptance, cache reuse, context, memory."""
    parts = [f"prefill {stats.get('prefill_tps', 0):.0f} · decode {stats.get('decode_tps', 0):.1f} tok/s"]
    if stats.get("draft_proposed"):
        parts.append(f"draft {100 * stats.get('acceptance', 0):.0f}%")
    parts.append(f"reused {_si(stats.get('reused_tokens', 0))}/{_si(stats.get('prompt_tokens', 0))}")
    used = stats.get("prompt_tokens", 0) + stats.get("generated_tokens", 0)
    limit = stats.get("context_length")
    parts.append(f"ctx {_si(used)}" + (f"/{_si(limit)}" if limit else ""))
    parts.append(f"{stats.get('peak_memory_bytes', 0) / 2**20:.0f} MB")
    if stats.get("kv_budget_bytes"):
        parts.append(f"KV {_size(stats.get('kv_bytes', 0))}/{_size(stats['kv_budget_bytes'])}")
    return " · ".join(parts)


class StatusLine(Static):
    """Shows the engine state, and its figures unless ``SHOW_FIGURES`` is off."""

    def __init__(self, **kwargs) -> None:
        super().__init__("Starting…", **kwargs)
        self.model = ""
        self.stats: dict[str, Any] = {}
        self._started = 0.0
        self._tokens = 0

    def loading(self, what: str) -> None:
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

    def finished(self, stats: dict[str, Any], reason: str) -> None:
        self.stats = stats
        self.show_idle(reason)

    def show_idle(self, reason: str = "") -> None:
        label = {"stopped": "stopped", "length": "max tokens reached", "error": "failed",
                 "cut while thinking": "cut off while thinking: no answer (raise max tokens, f10)"}.get(reason, "")
        figures = stats_text(self.stats) if self.stats and SHOW_FIGURES else ""
        lead = "" if figures else self.model  # the header names the model; the figures need the room
        self.update(" · ".join(x for x in (lead, label, figures) if x) or "Ready")

"""The server's own options (``ServeSettings``) and their defaults: light, so that the command-line parser
(every ``mlxchat`` command builds it) reads the defaults without importing the server."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MAX_BODY_BYTES = 4 * 2**20
READ_SECONDS = 30.0  # like nginx's client_header_timeout and client_body_timeout (60 s there)
STALL_SECONDS = 60.0  # mlxcore.batching.runner's default (not imported here: the parser stays light)
# A stream sends a keep-alive this often while nothing else goes out (a long prompt being read): well within the
# read timeouts clients and proxies set (10 s and up), few bytes (llama.cpp's --sse-ping-interval).
PING_SECONDS = 5.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def duration_seconds(value: float | int | str) -> float:
    """Ollama's ``keep_alive``: seconds as a number, or a duration as Go writes it ("5m", "1h30m", "90s");
    negative keeps the model loaded. ``ValueError`` with a sentence for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text)
    try:
        return sign * float(body)
    except ValueError:
        pass
    parts = _DURATION.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise ValueError(f"{value!r} is not a duration: give seconds (300) or e.g. \"5m\", \"1h30m\", \"90s\".")
    return sign * sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


@dataclass(frozen=True)
class ServeSettings:
    """The server's own options."""

    api_key: str | None = None  # when set, every route but /health needs "Authorization: Bearer KEY"
    max_body_bytes: int = MAX_BODY_BYTES  # larger request bodies are refused with 413
    sessions_root: Path | None = None  # the session store's folder (None: the default store)
    pinned_sessions: int = 4  # restored sessions whose KV blocks stay held for their next request
    system: str | None = None  # a system prompt for conversations that bring none (--system)
    thinking: bool = True  # Qwen3 thinks first unless a request's chat_template_kwargs says otherwise
    stall_seconds: float = STALL_SECONDS  # a stream whose client reads nothing this long is closed (--stall-timeout)
    ping_seconds: float = PING_SECONDS  # a stream's keep-alive interval (--sse-ping-interval)
    read_timeout: float = READ_SECONDS  # the longest a request head, or a pause in its body, may take (--read-timeout)

"""The server's own options (``ServeSettings``) and their defaults: light, so that the command-line parser
(every ``mlxchat`` command builds it) reads the defaults without importing the server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAX_BODY_BYTES = 4 * 2**20
READ_SECONDS = 30.0  # like nginx's client_header_timeout and client_body_timeout (60 s there)
STALL_SECONDS = 60.0  # mlxcore.batching.runner's default (not imported here: the parser stays light)


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
    read_timeout: float = READ_SECONDS  # the longest a request head, or a pause in its body, may take (--read-timeout)

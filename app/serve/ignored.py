"""Fields a request set that have no meaning here (a request model's ``IGNORED``): accepted, and said.

Clients add hints and metadata with every release (prompt-cache keys, service tiers,
verbosity); refusing them would break a client for nothing, ignoring them silently
would hide it. The reply names them in ``X-Mlxchat-Ignored-Fields``, and the log too.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel

IGNORED_HEADER = "X-Mlxchat-Ignored-Fields"
log = logging.getLogger("mlxchat.serve")


def ignored_header(body: BaseModel) -> dict[str, str]:
    """The header naming the ignored fields ``body`` set (none: no header); logged once here."""
    names = [name for name in getattr(body, "IGNORED", ()) if getattr(body, name) is not None]
    if not names:
        return {}
    log.info("accepted and ignored (no meaning here): %s", ", ".join(names))
    return {IGNORED_HEADER: ", ".join(names)}

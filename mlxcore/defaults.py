"""Which models mlxchat uses when the user names none.

Online: a 4-bit Qwen3 target with a 4-bit Qwen3-0.6B draft from mlx-community.
Offline, or when the hub cannot be reached: the embedded demonstration pair.
The decision never waits more than about REACH_TIMEOUT_S seconds.
"""

from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlparse

from mlxcore.hub import cached_snapshot
from mlxcore.hub_names import env_flag, offline_by_env

ONLINE_TARGET = "mlx-community/Qwen3-8B-4bit"
ONLINE_DRAFT = "mlx-community/Qwen3-0.6B-4bit"
EMBEDDED_TARGET = "mini-target"
EMBEDDED_DRAFT = "mini-draft"
REACH_TIMEOUT_S = 1.5


def default_pair(offline: bool | None = None) -> tuple[str, str | None, str]:
    """(target ref, draft ref or None, a reason to show the user) for the default models.

    ``offline`` True forces the embedded pair, False skips the environment and
    reachability checks (the hub pair is downloaded if needed); None decides:
    MLXCHAT_OFFLINE or HF_HUB_OFFLINE set -> embedded; the online target in the
    local hub cache -> it; the hub reachable -> the online pair; else embedded.
    """
    if offline:
        return _embedded("offline")
    if offline is None and offline_by_env():
        flag = "MLXCHAT_OFFLINE" if env_flag("MLXCHAT_OFFLINE") else "HF_HUB_OFFLINE"
        return _embedded(f"offline ({flag} is set)")
    if cached_snapshot(ONLINE_TARGET) is not None:
        return _cached_target(assume_online=offline is False)
    if offline is False or hub_reachable():
        return ONLINE_TARGET, ONLINE_DRAFT, f"using {ONLINE_TARGET} with the draft {ONLINE_DRAFT}"
    return _embedded("the Hugging Face hub cannot be reached")


def hub_reachable(timeout: float = REACH_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout`` seconds (DNS included)."""
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname
    result: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    # A thread, because name resolution ignores socket timeouts and can hang.
    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(result and result[0])


def _cached_target(assume_online: bool) -> tuple[str, str | None, str]:
    if assume_online or cached_snapshot(ONLINE_DRAFT) is not None or hub_reachable():
        return ONLINE_TARGET, ONLINE_DRAFT, f"using {ONLINE_TARGET} with the draft {ONLINE_DRAFT}"
    return ONLINE_TARGET, None, (f"using {ONLINE_TARGET} from the local cache, without a draft: "
                                 f"{ONLINE_DRAFT} is not downloaded and the hub cannot be reached")


def _embedded(why: str) -> tuple[str, str | None, str]:
    return EMBEDDED_TARGET, EMBEDDED_DRAFT, f"{why}: using the embedded demonstration models"

"""Which models mlxchat uses when the user names none.

Online: a 4-bit Qwen3 target with a 4-bit Qwen3-0.6B draft from mlx-community, the largest target that leaves a
useful context in this machine's memory (``memory_fit``: Qwen3-8B from 12 GB, Qwen3-4B on an 8 GB Mac).
Offline, or when the hub cannot be reached: the embedded demonstration pair.
The decision never waits more than about REACH_TIMEOUT_S seconds.
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.request
from urllib.parse import urlparse

from mlxcore.hub import cached_snapshot
from mlxcore.hub_names import env_flag, offline_by_env
from mlxcore.kv.budget import format_bytes
from mlxcore.memory_fit import DRAFT, TARGETS, default_target, machine_ram

ONLINE_TARGET = TARGETS[0]  # with 12 GB of RAM or more
ONLINE_DRAFT = DRAFT
EMBEDDED_TARGET = "mini-target"
EMBEDDED_DRAFT = "mini-draft"
REACH_TIMEOUT_S = 1.5


def default_pair() -> tuple[str, str | None, str]:
    """(target ref, draft ref or None, a reason to show the user) for the default models.
    MLXCHAT_OFFLINE or HF_HUB_OFFLINE set -> embedded; the online target in the
    local hub cache -> it; the hub reachable -> the online pair; else embedded."""
    if offline_by_env():
        flag = "MLXCHAT_OFFLINE" if env_flag("MLXCHAT_OFFLINE") else "HF_HUB_OFFLINE"
        return _embedded(f"offline ({flag} is set)")
    target = default_target()
    if target is None:
        return _embedded(f"this machine's {format_bytes(machine_ram() or 0)} of memory leaves no room for a Qwen3 "
                         "model and its context")
    if cached_snapshot(target) is not None:
        return _cached_target(target)
    if hub_reachable():
        return target, ONLINE_DRAFT, _using(target)
    return _embedded("the Hugging Face hub cannot be reached")


def hub_reachable(timeout: float = REACH_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub, or to the HTTPS proxy requests would go through, opens within
    ``timeout`` seconds (DNS included)."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname, endpoint.port or 443
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if proxy and not urllib.request.proxy_bypass(host or ""):
        parsed = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host, port = parsed.hostname, parsed.port or 8080
    result: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    # A thread, because name resolution ignores socket timeouts and can hang.
    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(result and result[0])


def _using(target: str) -> str:
    smaller = "" if target == ONLINE_TARGET else f" ({ONLINE_TARGET} would leave little room for context here)"
    return f"using {target} with the draft {ONLINE_DRAFT}{smaller}"


def _cached_target(target: str) -> tuple[str, str | None, str]:
    if cached_snapshot(ONLINE_DRAFT) is not None or hub_reachable():
        return target, ONLINE_DRAFT, _using(target)
    return target, None, (f"using {target} from the local cache, without a draft: "
                          f"{ONLINE_DRAFT} is not downloaded and the hub cannot be reached")


def _embedded(why: str) -> tuple[str, str | None, str]:
    return EMBEDDED_TARGET, EMBEDDED_DRAFT, f"{why}: using the embedded demonstration models"

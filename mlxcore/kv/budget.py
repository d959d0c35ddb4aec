"""The KV memory budget in bytes: ``--max-kv`` parsing, the machine's default, and the shared account.

No MLX import at module level: the chat window's process parses ``--max-kv``
with this module and never runs MLX.

- ``parse_max_kv("8GB")`` -> ``KVLimit(bytes=8_000_000_000)``; ``"4096"`` -> ``KVLimit(tokens=4096)``.
- ``machine_kv_bytes(weights)``: what the KV caches may take on this machine: on a GPU its memory
  (Metal's recommended working set, CUDA's total) less the weights, and no more than CUDA says is free;
  on the CPU the available RAM; each less a margin.
- ``KVBudget``: one account shared by the target's and the draft's pools. A pool checks the
  bytes free before an append changes anything (``BlockPool.make_room``), takes them as it adds
  slabs, and gives them back when it drops them.
"""

from __future__ import annotations

import os
import re
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlxcore.errors import MlxchatError

if TYPE_CHECKING:  # no MLX import at run time (module docstring)
    import mlx.core as mx
    import mlx.nn as nn


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 10**3, "m": 10**6, "g": 10**9}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*$")
MARGIN_FRACTION = 0.1  # of the machine's memory, kept free for activations, the OS and other programs
MIN_MARGIN_BYTES = 512 * 2**20


@dataclass(frozen=True)
class KVLimit:
    """What ``--max-kv`` asked for: a number of tokens, or a size in bytes (exactly one)."""

    tokens: int | None = None
    bytes: int | None = None


def parse_max_kv(text: str) -> KVLimit:
    """``"4096"`` (tokens) or a size with a unit (``"8GB"``, ``"512MB"``, ``"1.5GiB"``); ``ValueError`` otherwise."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"max_kv {text!r} is neither a number of tokens (4096) nor a size (8GB, 512MB, 1.5GiB).")
    number = float(match.group(1))
    if not match.group(2):
        if "." in match.group(1) or number < 1:
            raise ValueError(f"max_kv {text!r}: a number of tokens must be a whole number of at least 1.")
        return KVLimit(tokens=int(number))
    size = int(number * _UNITS[unit])
    if size < 1:
        raise ValueError(f"max_kv {text!r}: the size must be more than 0 bytes.")
    return KVLimit(bytes=size)


def format_bytes(size: int) -> str:
    """``1536000000`` -> ``"1.5 GB"`` (decimal units, as ``--max-kv`` takes them)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def available_ram() -> int:
    """Bytes of RAM the OS can give now (Linux ``MemAvailable``; else free pages; else, as macOS names no free
    pages, every page: MLX on a Mac's CPU)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return os.sysconf(name) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            continue
    raise MlxchatError("This machine's memory cannot be read: give the KV cache a size (--max-kv 8GB).")


def weights_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters."""
    from mlx.utils import tree_flatten

    arrays: list[tuple[str, mx.array]] = []
    tree_flatten(model.parameters(), destination=arrays)  # fills the list (its return type is list or dict)
    return sum(array.nbytes for _, array in arrays)


def wire_recommended_limit() -> int | None:
    """On Metal, let MLX keep up to the recommended working set wired (resident), as mlx-lm's generate does;
    returns the previous limit. None, and nothing changed, where the device reports no such size (the CPU)."""
    from mlx_lm.utils import maybe_set_recommended_wired_limit

    return maybe_set_recommended_wired_limit()


def machine_kv_bytes(weights_bytes: int) -> int:
    """The bytes the KV caches may take here (weights already loaded): the GPU's memory less the weights (no
    more than is free, where the device tells), or the available RAM, each less a margin. At least one MiB."""
    from mlxcore.device_profile import gpu_memory

    gpu = gpu_memory()
    if gpu is not None:
        total, free = gpu
        room = total - weights_bytes if free is None else min(total - weights_bytes, free)
    else:
        total = room = available_ram()
    return max(room - max(int(total * MARGIN_FRACTION), MIN_MARGIN_BYTES), 2**20)


class KVBudget:
    """Bytes of KV memory shared by the pools of one engine (target and draft); tensor-free."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"The KV budget must be at least 1 byte, not {limit}.")
        self.limit = limit
        self.in_use = 0  # bytes taken now
        self.peak = 0  # most bytes taken at once
        self.pools: weakref.WeakSet = weakref.WeakSet()  # pools (and batch mirrors) that take from this budget

    @property
    def free(self) -> int:
        return self.limit - self.in_use

    def force(self, size: int) -> None:
        """Take ``size`` bytes the caller checked would fit (``free``) before changing anything: the memory is
        allocated by now, so an estimate that fell short shows in ``peak`` (tests check it) rather than crash a chat."""
        self.in_use += size
        self.peak = max(self.peak, self.in_use)

    def give(self, size: int) -> None:
        """Give back ``size`` bytes taken earlier."""
        assert 0 <= size <= self.in_use, "gave back more KV bytes than were taken"
        self.in_use -= size

    def reclaimable(self, besides: object = None) -> int:
        """Bytes ``reclaim`` would give back from the pools other than ``besides``."""
        return sum(pool.reclaimable_bytes() for pool in list(self.pools) if pool is not besides)

    def reclaim(self) -> int:
        """Ask every pool to give back its free slabs, cached prefixes included; bytes freed."""
        return sum(pool.release_free_slabs(cached=True) for pool in list(self.pools))

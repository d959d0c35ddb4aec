"""What the user chooses before a model runs: which models, which KV cache. No MLX here,
so the UI process can build and check these without loading MLX."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlxcore.errors import UsageError


KVKind = Literal["paged", "rotating", "standard"]


@dataclass(frozen=True)
class ModelChoice:
    """What the user asked for on the command line or in the TUI."""

    model: str | None = None  # hub repo id, local folder or embedded name; None = the default pair
    draft: str | None = None  # None = the default pair's draft when the default model is used; LOOKUP: prompt lookup
    no_draft: bool = False  # decode plainly even when a draft is available


@dataclass(frozen=True)
class KVConfig:
    """Which KV cache the engine makes, and its geometry."""

    kind: KVKind = "paged"  # "paged" (block pool, prefix sharing), "rotating" (window) or "standard" (mlx-lm's)
    max_kv: int | None = None  # rotating: window in tokens; paged: pool capacity in tokens (None = grow as needed)
    block_size: int = 16  # paged: tokens per block
    max_kv_bytes: int | None = None  # paged: KV memory budget shared by target and draft (None = from the machine)
    kv_bits: int | None = None  # paged, rotating: keys and values quantized to 8 bits (None = the model's float)
    disk_kv_bytes: int = 0  # paged: the disk tier's budget in bytes (blocks that leave memory, read back); 0 = off
    disk_kv_dir: str | None = None  # paged: the folder of the disk tier (needed when disk_kv_bytes is set)

    def __post_init__(self) -> None:
        if self.kind not in ("paged", "rotating", "standard"):
            raise ValueError(f"unknown KV cache kind {self.kind!r}: choose paged, rotating or standard")
        if self.kind == "rotating" and not self.max_kv:
            raise ValueError("the rotating cache needs a window size (max_kv)")
        if self.max_kv is not None and self.max_kv < 1:
            raise ValueError(f"max_kv must be positive, not {self.max_kv}")
        if self.max_kv_bytes is not None and self.max_kv_bytes < 1:
            raise ValueError(f"max_kv_bytes must be positive, not {self.max_kv_bytes}")
        if self.disk_kv_bytes < 0:
            raise ValueError(f"disk_kv_bytes must be 0 (off) or positive, not {self.disk_kv_bytes}")
        if self.disk_kv_bytes and not self.disk_kv_dir:
            raise ValueError("a disk tier (disk_kv_bytes) needs its folder (disk_kv_dir)")
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, not {self.block_size}")
        if self.kv_bits is not None and self.kind == "standard":
            raise ValueError('a quantized KV cache (kv_bits) needs kind="paged" or kind="rotating"')


LOOKUP = "lookup"  # --draft lookup: draft tokens found in the reply's own text (mlxcore/prompt_lookup.py)


def check_num_draft(num_draft: int) -> int:
    """``num_draft`` when it is a usable cap on the draft length, else ``UsageError``."""
    if num_draft < 1:
        raise UsageError(f"num_draft must be at least 1, not {num_draft}")
    return num_draft

"""Whether a model fits this machine's memory, checked before anything is downloaded or loaded.

No MLX import: the CLI and the window's process use it. The machine's memory is read in one place,
``machine_ram()``, which tests fake with ``MLXCHAT_MEMORY`` (e.g. ``8GB``). On a Mac the GPU may use Metal's
recommended working set, about 2/3 of the RAM below 64 GB and 3/4 from there (figures reported by Metal on 16, 32 and
64 GB Macs); the KV caches get what the weights leave of it, less ``kv.budget``'s margin. The thresholds this gives, and
how they were worked out, are in docs/memory.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlxcore.errors import ModelLoadError
from mlxcore.fingerprint import WEIGHTS_GLOB
from mlxcore.kv.budget import MARGIN_FRACTION, MIN_MARGIN_BYTES, format_bytes, parse_max_kv

MEMORY_ENV = "MLXCHAT_MEMORY"  # the machine's RAM as this module sees it (tests fake an 8, 16 or 64 GB Mac)
USEFUL_CONTEXT = 8192  # tokens a default pair must leave room for: a thinking reply and the chat before it

# mlx-community's 4-bit Qwen3 (group size 64: 4.5 bits a parameter): (bytes of weights, bytes of KV a token in bf16).
# The weights are the repos' safetensors sizes; the KV is 2 x layers x KV heads x head size x 2 bytes.
QWEN3_4BIT = {
    "mlx-community/Qwen3-0.6B-4bit": (335_000_000, 2 * 28 * 8 * 128 * 2),
    "mlx-community/Qwen3-1.7B-4bit": (960_000_000, 2 * 28 * 8 * 128 * 2),
    "mlx-community/Qwen3-4B-4bit": (2_260_000_000, 2 * 36 * 8 * 128 * 2),
    "mlx-community/Qwen3-8B-4bit": (4_610_000_000, 2 * 36 * 8 * 128 * 2),
    "mlx-community/Qwen3-14B-4bit": (8_300_000_000, 2 * 40 * 8 * 128 * 2),
    "mlx-community/Qwen3-32B-4bit": (18_450_000_000, 2 * 64 * 8 * 128 * 2),
}
DRAFT = "mlx-community/Qwen3-0.6B-4bit"
TARGETS = ("mlx-community/Qwen3-8B-4bit", "mlx-community/Qwen3-4B-4bit", "mlx-community/Qwen3-1.7B-4bit")


def machine_ram() -> int | None:
    """Bytes of RAM in this machine (``MLXCHAT_MEMORY`` when set); None where the OS names no size."""
    faked = os.environ.get(MEMORY_ENV)
    if faked:
        limit = parse_max_kv(faked)
        if limit.bytes is None:
            raise ValueError(f"{MEMORY_ENV} must be a size such as 16GB, not {faked!r}")
        return limit.bytes
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def model_memory(ram: int) -> int:
    """Bytes of ``ram`` models may use: Metal's recommended working set (2/3 of RAM, 3/4 from 64 GiB)."""
    return ram * 3 // 4 if ram >= 64 * 2**30 else ram * 2 // 3


def kv_room(memory: int, weights: int) -> int:
    """Bytes left to the KV caches in ``memory`` beside ``weights``, less the margin (``kv.budget``'s rule)."""
    return memory - weights - max(int(memory * MARGIN_FRACTION), MIN_MARGIN_BYTES)


def pair_tokens(target: str, ram: int) -> int:
    """Tokens of context ``target`` and the draft leave on a machine of ``ram`` bytes (0 if none)."""
    weights, per_token = QWEN3_4BIT[target][0] + QWEN3_4BIT[DRAFT][0], QWEN3_4BIT[target][1] + QWEN3_4BIT[DRAFT][1]
    return max(kv_room(model_memory(ram), weights) // per_token, 0)


def default_target() -> str | None:
    """The largest Qwen3 4-bit target whose pair leaves ``USEFUL_CONTEXT`` tokens; None if none does."""
    ram = machine_ram()
    if ram is None:
        return TARGETS[0]
    return next((target for target in TARGETS if pair_tokens(target, ram) >= USEFUL_CONTEXT), None)


def folder_weights(folder: Path) -> int:
    """Bytes of the weights files in a model folder."""
    return sum(path.stat().st_size for path in folder.glob(WEIGHTS_GLOB))


def hub_weights(repo_id: str) -> int | None:
    """Bytes of a hub repo's weights without downloading them: the table above, else the hub's file list (None
    offline or when the hub does not answer)."""
    if repo_id in QWEN3_4BIT:
        return QWEN3_4BIT[repo_id][0]
    from mlxcore.hub_names import offline_by_env

    if offline_by_env():
        return None
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repo_id, files_metadata=True, timeout=5)
    except Exception:  # noqa: BLE001 - any failure only means the size is checked after the download instead
        return None
    sizes = [file.size or 0 for file in info.siblings or [] if file.rfilename.endswith(".safetensors")]
    return sum(sizes) or None


def check_fits(models: list[tuple[str, int | None]]) -> None:
    """Refuse, in one line with both numbers, models (name, bytes of weights or None if unknown) that together
    take more than the memory models may use here."""
    ram = machine_ram()
    known = [(name, size) for name, size in models if size]
    if ram is None or not known:
        return
    need, room = sum(size for _, size in known), model_memory(ram)
    if need > room:
        names = " and ".join(name for name, _ in known)
        raise ModelLoadError(
            f"{names} need {format_bytes(need)} of memory, more than the {format_bytes(room)} the GPU may use on this "
            f"machine ({format_bytes(ram)} of RAM): choose a smaller model with --model"
            f"{' or run without the draft (--no-draft)' if len(known) > 1 else ''}.")


def weights_before_download(ref: str) -> int | None:
    """Bytes of the weights ``ref`` names (an embedded model, a folder, a cached or remote hub repo), read without
    downloading anything; None when unknown."""
    from mlxcore.hub import cached_snapshot
    from mlxcore.hub_names import local_model

    local = local_model(ref)
    folder = local[0] if local else cached_snapshot(ref)
    return folder_weights(folder) if folder is not None else hub_weights(ref)

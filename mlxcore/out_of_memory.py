"""Out of memory: recognise MLX's allocation failures and say how much memory is needed and what to do."""

from __future__ import annotations

import errno

from mlxcore.device_profile import gpu_memory
from mlxcore.memory_fit import machine_ram

# How MLX words a failed allocation: Metal's allocator and command buffers, the C++ runtime on the CPU.
_OOM_TEXTS = ("[metal::malloc]", "[malloc] unable to allocate", "attempting to allocate", "insufficient memory", "out of memory",
              "outofmemory", "bad_alloc", "cannot allocate memory")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a failed memory allocation."""
    link: BaseException | None = error
    while link is not None:
        if isinstance(link, MemoryError) or (isinstance(link, OSError) and link.errno == errno.ENOMEM):
            return True
        if isinstance(link, RuntimeError) and any(text in str(link).lower() for text in _OOM_TEXTS):
            return True
        link = link.__cause__ or link.__context__
    return False


def machine_memory() -> tuple[int, str] | None:
    """(bytes, what they are) of the memory models run in: the GPU's (``gpu_memory``), or the RAM; None if
    unknown."""
    gpu = gpu_memory()
    if gpu is not None:
        return gpu[0], "usable by the GPU"
    ram = machine_ram()
    return (ram, "of memory") if ram is not None else None


def not_enough_memory(what: str, need_bytes: int | None) -> str:
    """A one-line message: loading ``what`` (needing about ``need_bytes``) ran out of memory, and what to do."""
    need = f": it needs about {_size(need_bytes)}" if need_bytes else ""
    machine = machine_memory()
    have = f" and this machine has {_size(machine[0])} {machine[1]}" if machine and need else ""
    return (f"Not enough memory to load {what}{need}{have}. Use a smaller model (fewer parameters, "
            "or a 4-bit one), or close other apps, then try again.")


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"

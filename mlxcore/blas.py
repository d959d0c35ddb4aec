"""Point MLX's Linux CPU backend at an optimized BLAS when the system has one.

MLX's Linux wheel links against a bundled reference BLAS that is ~50x slower
for float32 matmuls. Loading OpenBLAS with RTLD_GLOBAL *before* ``mlx.core`` is
first imported makes the dynamic linker resolve MLX's BLAS symbols to it.
Set ``MLXCHAT_BLAS=reference`` to keep the bundled one (the bench does, to
measure the difference).
"""

from __future__ import annotations

import ctypes
import os
import sys

# OpenBLAS first: a bare libblas.so.3 may be the (slow) netlib reference.
_CANDIDATES = ("libopenblas.so.0", "libblas.so.3")

loaded_library: str | None = None


def preload_optimized_blas() -> str | None:
    """Load an optimized BLAS globally; return its name, or None if none was loaded."""
    global loaded_library
    if loaded_library or sys.platform != "linux":
        return loaded_library
    if os.environ.get("MLXCHAT_BLAS", "").lower() == "reference":
        return None
    if "mlx.core" in sys.modules:
        return None  # too late: MLX already bound its BLAS symbols
    for name in _CANDIDATES:
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        loaded_library = name
        return name
    return None

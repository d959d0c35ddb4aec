"""Point MLX's Linux CPU backend at an optimized BLAS when the system has one.

MLX's Linux wheel links against a bundled reference BLAS, many times slower
for float32 matmuls (``blas_speedup`` in docs/benchmarks.md). Loading OpenBLAS
with RTLD_GLOBAL *before* ``mlx.core`` is first imported makes the dynamic
linker resolve MLX's BLAS symbols to it.
Set ``MLXCHAT_BLAS=reference`` to keep the bundled one (the bench does, to
measure the difference). ``parallel_products()`` gives prefill every thread;
decode's products run on one (docs/decisions.md, "OpenBLAS on Linux").
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

# OpenBLAS first: a bare libblas.so.3 may be the (slow) netlib reference.
_CANDIDATES = ("libopenblas.so.0", "libblas.so.3")

loaded_library: str | None = None
_threads: tuple | None = None  # (set_num_threads, get_num_threads, all threads) when the library is OpenBLAS


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
        _take_thread_control(name)
        return name
    return None


def _take_thread_control(name: str) -> None:
    """Remember OpenBLAS's thread count (OPENBLAS_NUM_THREADS applies) and start single-threaded."""
    global _threads
    library = ctypes.CDLL(name)
    try:
        setter, getter = library.openblas_set_num_threads, library.openblas_get_num_threads
    except AttributeError:
        return  # another optimized BLAS: leave its threading alone
    setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
    _threads = (setter, getter, getter())
    setter(1)


def blas_threads() -> int | None:
    """The number of threads OpenBLAS uses now (None when it is not the loaded BLAS)."""
    return _threads[1]() if _threads else None


@contextlib.contextmanager
def parallel_products() -> Iterator[None]:
    """Matrix products inside use every thread (prefill); outside, one.

    The count changes only with nothing in flight: work queued before is waited
    for here, and callers evaluate their own work before leaving.
    """
    if _threads is None:
        yield
        return
    import mlx.core as mx  # imported late: this module must load before MLX does

    mx.synchronize()  # a reply's last pipelined decode step may still be running single-threaded
    setter, _, every = _threads
    setter(every)
    try:
        yield
    finally:
        setter(1)

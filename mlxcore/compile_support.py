"""Whether ``mx.compile`` runs here, and telling the user once when it does not.

On Linux MLX compiles fused kernels with the system C++ compiler at run time;
a machine without one (or a sandboxed temp folder) decodes uncompiled, slower.
``MLXCHAT_COMPILE=0`` turns compiling off on purpose.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache

import mlx.core as mx

from mlxcore.fingerprint import one_line

_told = False  # whether a failed compile was reported (report_compile_failure)


def _wanted() -> bool:
    return os.environ.get("MLXCHAT_COMPILE", "1") != "0"  # the user may turn compiling off


@lru_cache(maxsize=1)
def compile_works() -> bool:
    """Whether decoding compiles: wanted, and ``mx.compile`` runs here."""
    return _wanted() and compile_failure() is None


@lru_cache(maxsize=1)
def compile_failure() -> str | None:
    """Why ``mx.compile`` does not run here (on Linux it needs a C++ compiler at run time), or None if it does."""
    try:
        mx.eval(mx.compile(lambda x: mx.exp(x) * 2 + 1)(mx.ones(4)))
        return None
    except Exception as error:  # no toolchain, sandboxed temp folder...: decode uncompiled, and say why
        return f"{type(error).__name__}: {one_line(error)}"[:300]


def report_compile_failure(notice: Callable[[str], None]) -> None:
    """Tell ``notice`` that decoding runs without compiled kernels, and why: once per process."""
    global _told
    if _told or not _wanted() or compile_failure() is None:
        return
    _told = True
    notice(f"decoding without compiled kernels: {compile_failure()}")

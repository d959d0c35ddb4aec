"""The open-file limit, kept within what the system allows when mlx-lm is imported.

Importing ``mlx_lm.utils`` runs ``resource.setrlimit(RLIMIT_NOFILE, (2048, 4096))``
(for models of many files). Under a hard limit below 4096 that raises ValueError, so
the import, and mlxchat with it, fails; above it, it lowers both limits for the rest of
the process. ``guard_mlx_lm_import`` (run by ``import mlxcore``) turns that one call
into "raise the soft limit as far as the hard limit allows, never lower a limit";
``low_limit_note`` tells the user when the hard limit is under what mlx-lm wanted.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import resource
import sys
from collections.abc import Sequence
from types import ModuleType

WANTED_OPEN_FILES = 4096  # the hard limit mlx-lm asks for
GUARDED_MODULE = "mlx_lm.utils"  # the module whose import sets the limit


def raise_soft_limit(wanted: int) -> None:
    """Raise the soft open-file limit to ``wanted``, or to the hard limit if that is lower; never lower it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def low_limit_note() -> str | None:
    """A line for the user when the hard open-file limit is under ``WANTED_OPEN_FILES``, else None."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard >= WANTED_OPEN_FILES:
        return None
    return (f"the open-file limit is low ({hard}; mlx-lm asks for {WANTED_OPEN_FILES}): a model of many files "
            f"may fail to load. Raise it with `ulimit -n {WANTED_OPEN_FILES}` (the hard limit may need an "
            "administrator).")


def guard_mlx_lm_import() -> None:
    """From now on, ``mlx_lm.utils`` is imported with the limit-keeping ``setrlimit`` (see the module docstring)."""
    if not any(isinstance(finder, _GuardedImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _GuardedImport())


class _GuardedImport(importlib.abc.MetaPathFinder):
    """Finds ``mlx_lm.utils`` as Python would, and runs its module code with ``setrlimit`` kept within limits."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != GUARDED_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _LimitKeepingLoader(spec.loader)
        return spec


class _LimitKeepingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        real = resource.setrlimit

        def within_limits(which: int, limits: tuple[int, int]) -> None:
            if which != resource.RLIMIT_NOFILE:
                return real(which, limits)
            raise_soft_limit(limits[0])

        resource.setrlimit = within_limits  # only while the module's top level runs
        try:
            self._loader.exec_module(module)
        finally:
            resource.setrlimit = real

    def __getattr__(self, name: str) -> object:  # get_source, get_filename, ...: the real loader's
        return getattr(self._loader, name)

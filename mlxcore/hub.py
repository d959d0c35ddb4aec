"""Hugging Face hub access: the cache folder, offline mode, downloads with progress.

huggingface-hub reads HF_HUB_CACHE and HF_HUB_OFFLINE once, when it is imported.
This module reads them (and MLXCHAT_OFFLINE) on every call and passes the
result explicitly (``cache_dir=``, ``local_files_only=``), so setting them later,
in the CLI or in a test, still takes effect.
"""

from __future__ import annotations

import errno
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from huggingface_hub import snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                     RepositoryNotFoundError)
from huggingface_hub.utils import tqdm as hf_tqdm
from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

from mlxcore.errors import ModelLoadError
from mlxcore.fingerprint import WEIGHTS_GLOB, one_line
from mlxcore.hub_names import hub_cache_dir, offline_by_env

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total so far) while a download runs, from worker threads."""

_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}  # no space left, or over the disk quota
_NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


def cached_snapshot(repo_id: str) -> Path | None:
    """The local snapshot folder of ``repo_id`` if its config and weights are cached, else None."""
    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=hub_cache_dir())
    if not isinstance(found, str):
        return None
    folder = Path(found).parent
    return folder if any(folder.glob(WEIGHTS_GLOB)) else None


def download(repo_id: str, *, progress: Progress | None = None) -> Path:
    """The local folder of ``repo_id``, downloading what is missing (mlx-lm's file patterns).

    Progress goes to a bar on stderr, or to ``progress`` when given. Offline, only
    the cache is used. A failed transfer (network, disk, hub) is a ModelLoadError that
    says what to do; any other exception is a bug and propagates as it is."""
    offline = offline_by_env()
    try:
        folder = snapshot_download(repo_id, cache_dir=hub_cache_dir(), local_files_only=offline,
                                   allow_patterns=DEFAULT_ALLOW_PATTERNS,
                                   tqdm_class=_callback_tqdm(progress) if progress else None)
    except (RepositoryNotFoundError, GatedRepoError) as error:
        raise ModelLoadError(f"The hub has no model {repo_id!r}, or it is private or gated "
                             "(log in with `hf auth login`); check the name.") from error
    except LocalEntryNotFoundError as error:
        raise _not_cached(repo_id, offline, error) from error
    except _transfer_errors() as error:  # anything else is a bug, and must show as one
        raise _failed_transfer(repo_id, error) from error
    return Path(folder)


def _failed_transfer(repo_id: str, error: BaseException) -> ModelLoadError:
    """The message for a download stopped by the disk (full, not writable) or by the network."""
    where, reason = hub_cache_dir(), f"{type(error).__name__}: {one_line(error)[:200]}"
    if _disk_full(error):
        return ModelLoadError(f"Downloading {repo_id!r} stopped: the disk that holds the hub cache ({where}) "
                              "is full. Free some space, or set HF_HUB_CACHE to a folder on a larger disk, "
                              "then try again.")
    if isinstance(error, OSError) and (error.filename is not None or error.errno in _NOT_WRITABLE):
        return ModelLoadError(f"Downloading {repo_id!r} failed writing to the hub cache ({where}): {reason}; "
                              "check that this folder can be written, or set HF_HUB_CACHE to another one.")
    return ModelLoadError(f"Downloading {repo_id!r} failed ({reason}); check the network connection, "
                          "then try again.")


def _transfer_errors() -> tuple[type[BaseException], ...]:
    """The errors of a failed transfer: the OS's (network, disk, hf_xet's), the hub's, and its HTTP stack's.
    requests' errors are OSErrors; httpx's are not. The HTTP stack differs by
    huggingface-hub version, so take the one it imported rather than import one."""
    found: list[type[BaseException]] = [OSError, HfHubHTTPError]
    for name in ("httpx", "httpx2"):
        module = sys.modules.get(name)
        if module is not None and isinstance(getattr(module, "HTTPError", None), type):
            found.append(module.HTTPError)
    return tuple(found)


def _disk_full(error: BaseException | None) -> bool:
    """Whether ``error``, or one it was raised from, is "no space left on device"."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in _DISK_FULL:
            return True
        if "no space left on device" in str(error).lower():  # hf_xet's errors carry the OS's words, no errno
            return True
        error = error.__cause__ or error.__context__
    return False


def _not_cached(repo_id: str, offline: bool, error: Exception) -> ModelLoadError:
    where = hub_cache_dir()
    if offline:
        return ModelLoadError(f"{repo_id!r} is not in the local hub cache ({where}) and downloads are off "
                              "(HF_HUB_OFFLINE or MLXCHAT_OFFLINE); unset it and connect, "
                              "or use an embedded model.")
    cause = error.__cause__ or error  # huggingface-hub chains the network error
    return ModelLoadError(f"Could not reach the hub to download {repo_id!r} ({type(cause).__name__}: "
                          f"{one_line(cause)[:120]}) and it is not complete in the local cache ({where}); "
                          "check the network, or use an embedded model.")


def _callback_tqdm(progress: Progress) -> type[hf_tqdm]:
    """A silent tqdm class that reports snapshot_download's byte counts to ``progress``."""
    lock = threading.Lock()

    class CallbackTqdm(hf_tqdm):
        def __init__(self, *args: object, **kwargs: object) -> None:
            # snapshot_download names the bar that sums the bytes written by all files.
            self._reports = kwargs.get("name") == "huggingface_hub.snapshot_download"
            initial = kwargs.get("initial")
            self._done = int(initial) if isinstance(initial, int | float) else 0
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if self._reports:
                with lock:
                    self._done += int(n or 0)
                    progress(self._done, int(self.total or 0))
            shown: bool | None = super().update(n)
            return shown

    return CallbackTqdm

"""Data down to the drive, the commit points of session files and the store rely on it.

On macOS ``fsync`` hands the data to the drive but leaves it in the drive's cache, which may write it later and out
of order; only ``fcntl(F_FULLFSYNC)`` flushes that cache (Apple's fsync(2) man page). CPython's ``os.fsync`` does not
use it, so a power loss could leave a trailer on disk before the blocks it names. Elsewhere ``os.fsync`` does both.
"""

from __future__ import annotations

import fcntl
import os


def sync_to_disk(fd: int) -> None:
    """Flush ``fd``'s data to the drive itself: F_FULLFSYNC where the platform has it, else (or where the file
    system refuses it: SMB, some external drives) ``os.fsync``."""
    full = getattr(fcntl, "F_FULLFSYNC", None)
    if full is not None:
        try:
            fcntl.fcntl(fd, full)
            return
        except OSError:
            pass
    os.fsync(fd)

"""What a bench report says about where it ran: the machine, chip, memory, OS and library versions."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path


def machine_info() -> dict:
    """The facts a bug report about speed needs, read without loading MLX's device."""
    return {"system": f"{platform.system()} {platform.release()}", "os": _os_name(), "arch": platform.machine(),
            "chip": _chip(), "cpu_count": os.cpu_count(), "memory_bytes": _memory_bytes(),
            "python": platform.python_version(), "mlx": _version("mlx"), "mlx_lm": _version("mlx-lm"),
            "mlxchat": _version("mlxchat")}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _os_name() -> str:
    if sys.platform == "darwin":
        return f"macOS {platform.mac_ver()[0]}"
    release = Path("/etc/os-release")
    if release.is_file():
        for line in release.read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    return platform.platform()


def _chip() -> str:
    if sys.platform == "darwin":  # e.g. "Apple M2 Pro"
        return _sysctl("machdep.cpu.brand_string") or platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    if sys.platform == "darwin":
        value = _sysctl("hw.memsize")
        return int(value) if value and value.isdigit() else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def _sysctl(name: str) -> str | None:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None

"""Free ports on 127.0.0.1 for a ring of local ranks (``mlx.launch -p PORT`` listens on PORT + rank), and the
host file that starts such a ring by hand (MLX_RANK and MLX_HOSTFILE, as mlx.launch sets them)."""

from __future__ import annotations

import json
import socket
from pathlib import Path


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports that are free now."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first: int = probe.getsockname()[1]
        if first + count < 65536 and all(_free(first + i) for i in range(count)):
            return first
    raise RuntimeError("no free ports on 127.0.0.1")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def local_hostfile(path: Path, ranks: int) -> Path:
    """Write a ring host file for ``ranks`` processes on 127.0.0.1 (one "host:port" per rank) to ``path``."""
    first = free_ports(ranks)
    path.write_text(json.dumps([[f"127.0.0.1:{first + rank}"] for rank in range(ranks)]))
    return path

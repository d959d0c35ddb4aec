"""The disk tier's writer SIGKILLed at each of its first I/O events, for tests/test_kv_disk_tier.py.

``python tests/disk_tier_kill_helper.py ROOT BLOCKS`` forks, for K = 1, 2, ..., a child that hands BLOCKS
blocks to a ``DiskTier`` in ROOT and SIGKILLs itself at its K-th I/O event (an audit event: open, mkdir,
rename, remove), until a child ends without reaching K. After each kill a new tier opens ROOT, as the next
process would: it must have removed every half-written file, and every block it still has must be whole.
Prints one JSON line: the points killed at, how many of them left a half-written file, and what went wrong (an empty list when nothing did).
No MLX here: the tier's own disk code is what a kill can leave half done.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlxcore.kv.block_frame import block_payload  # noqa: E402
from mlxcore.kv.disk_tier import DiskTier  # noqa: E402

EVENTS = ("open", "os.mkdir", "os.rename", "os.replace", "os.remove", "os.unlink")


def block(n: int) -> tuple[str, bytes]:
    """Block ``n``'s key and payload (sizes that take several writes' worth of bytes)."""
    return hashlib.blake2b(str(n).encode(), digest_size=20).hexdigest(), block_payload([n] * 16, [bytes([n % 251]) * 30000])


def child(root: Path, blocks: int, kill_at: int) -> None:
    seen = 0

    def hook(event: str, args: tuple) -> None:
        nonlocal seen
        if event in EVENTS and str(root) in str(args[:1]):
            seen += 1
            if seen == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    tier = DiskTier(root, 1 << 30)
    for n in range(blocks):
        tier.put(*block(n))
    tier.drain()
    os._exit(0)


def check(root: Path, blocks: int) -> list[str]:
    tier = DiskTier(root, 1 << 30)
    wrong = [f"{path} stayed" for path in root.rglob("*.tmp")]  # a new process removes what was half written
    for n in range(blocks):
        key, expected = block(n)
        got = tier.read(key)
        if got is not None and got != expected:
            wrong.append(f"block {n} holds other bytes")
    return wrong


def main() -> None:
    root, blocks = Path(sys.argv[1]), int(sys.argv[2])
    killed, problems, half_written = [], [], 0
    for kill_at in range(1, 10 * blocks):
        for path in sorted(root.rglob("*"), reverse=True):  # each point starts from an empty tier
            path.rmdir() if path.is_dir() else path.unlink()
        pid = os.fork()
        if pid == 0:
            child(root, blocks, kill_at)
        _, status = os.waitpid(pid, 0)
        if not os.WIFSIGNALED(status):
            break  # the writes ended before the K-th event
        killed.append(kill_at)
        half_written += any(root.rglob("*.tmp"))
        problems += [f"killed at event {kill_at}: {text}" for text in check(root, blocks)]
    print(json.dumps({"killed": killed, "half_written": half_written, "problems": problems}))


if __name__ == "__main__":
    main()

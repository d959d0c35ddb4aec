"""A lost rank ends this process at once, where it is noticed.

When a collective fails because a peer went away, MLX's ring is broken for good:
it fails the collectives pending then, but one submitted later waits forever
(seen here: a rank blocked in its next ``all_sum``; ml-explore/mlx#3862 is the
same family). So nothing may wait on the ring after that:

- ``exit_on_lost_peer``: where MLX's error comes up as a RuntimeError, the rank
  says why and exits right there, skipping cleanups that would queue more work
  on the ring (a reply cut short that way is not saved anyway; files are written
  atomically).
- ``watch_ring_failures``: MLX's ring says on stderr when it gives up on a peer.
  If this process has not ended ``GRACE_SECONDS`` after that line (its main
  thread waits on a collective that will never finish), it is ended the same way.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mlxcore.distributed.errors import is_lost_peer, lost_peer
from mlxcore.distributed.world import World

RING_GAVE_UP = b"Too many send/recv errors"  # how MLX's ring backend says it dropped a peer
GRACE_SECONDS = 2.0
_exiting = threading.Lock()
_relay: tuple[threading.Thread, int] | None = None  # (the relay thread, the terminal's descriptor)


@contextmanager
def exit_on_lost_peer(world: World) -> Iterator[None]:
    try:
        yield
    except RuntimeError as error:
        if world.distributed and is_lost_peer(error):
            stop_now(str(lost_peer(error, world.rank, world.size)))
        raise


def stop_now(message: str) -> None:
    """Say ``message`` and end the process (once, whichever thread gets here first)."""
    if _exiting.acquire(blocking=False):
        sys.stderr.write(f"mlxchat: {message}\n")
        _drain()
        os._exit(1)
    threading.Event().wait()  # another thread is already ending the process


def watch_ring_failures(world: World) -> None:
    """Relay this process's stderr (file descriptor 2) through a pipe and watch it for the ring giving up."""
    global _relay
    if not world.distributed or _relay is not None:
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    _relay = (threading.Thread(target=_pass_on, args=(read_end, terminal, world), name="mlxchat-stderr",
                               daemon=True), terminal)
    _relay[0].start()
    atexit.register(_drain)  # what was written last reaches the terminal before the process ends


def _drain() -> None:
    """Put the terminal back on stderr and let the relay pass on what the pipe still holds."""
    if _relay is None:
        return
    thread, terminal = _relay
    sys.stderr.flush()
    os.dup2(terminal, 2)  # the pipe's last writer is gone: the relay reads to its end and stops
    if thread is not threading.current_thread():
        thread.join(timeout=GRACE_SECONDS)


def _pass_on(read_end: int, terminal: int, world: World) -> None:
    tail = b""
    while data := os.read(read_end, 65536):
        view = memoryview(data)
        while view:
            view = view[os.write(terminal, view):]
        if RING_GAVE_UP in tail + data:
            message = str(lost_peer(RuntimeError("[ring] it gave up on a peer"), world.rank, world.size))
            timer = threading.Timer(GRACE_SECONDS, stop_now, args=(message,))
            timer.daemon = True  # a process that ends by itself meanwhile ends as it chose
            timer.start()
        tail = data[-len(RING_GAVE_UP):]

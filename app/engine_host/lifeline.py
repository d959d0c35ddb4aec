"""The engine process ends with the UI: however the UI process goes away, the engine exits within a second.

The pipe's end of file tells an idle or generating engine host that the UI is
gone (it stops the reply, saves the chat and returns). This watch covers the
rest: work that reads no commands for a while (a prefill chunk, a download, the
model load). When the parent process ends it marks the UI gone, gives the host
GRACE_SECONDS to finish, then ends the process; a save in progress is waited for,
so a chat file is never cut short (writes are atomic in any case).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

GRACE_SECONDS = 0.8


def watch_parent(ui_gone: threading.Event, saving: threading.Lock, grace: float = GRACE_SECONDS) -> threading.Thread:
    """Start a daemon thread that ends this process once its parent has ended (see the module docstring)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        raise RuntimeError("watch_parent needs a process started by multiprocessing")

    def watch() -> None:
        parent.join()  # waits on the parent's sentinel: returns when the parent process has ended
        ui_gone.set()
        time.sleep(grace)
        saving.acquire()  # let a save in progress finish; none starts after this
        os._exit(0)

    thread = threading.Thread(target=watch, name="mlxchat-parent-watch", daemon=True)
    thread.start()
    return thread

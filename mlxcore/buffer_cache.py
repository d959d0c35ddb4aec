"""MLX's buffer cache, kept small as mlx-lm keeps it.

MLX keeps freed buffers for reuse. On Metal that cache may grow to about 0.95 of the working set and stays wired
(macOS 15+); on Linux's CPU backend it is capped at 32 MB, which is why the suite raises the cap to Metal's to see
this (tests/test_buffer_cache.py). mlx-lm clears it after each prompt chunk, every 256 generated tokens and before
loading another model; so does mlxchat, with a limit at engine start, and a counter on the decode path (never a call
per token).
"""

from __future__ import annotations

import gc

import mlx.core as mx

LIMIT_BYTES = 2**30  # at most this much kept for reuse ...
LIMIT_FRACTION = 0.1  # ... and no more than this share of what the GPU may use
CLEAR_EVERY_STEPS = 256  # decode steps between clears (mlx-lm: every 256 tokens)


def limit(memory: int | None) -> None:
    """At engine start: cap the cache at ``min(LIMIT_BYTES, LIMIT_FRACTION x memory)``; a lower cap stays (the
    CPU backend's 32 MB)."""
    cap = LIMIT_BYTES if not memory else min(LIMIT_BYTES, int(memory * LIMIT_FRACTION))
    previous = mx.set_cache_limit(cap)
    if previous < cap:
        mx.set_cache_limit(previous)


def clear() -> None:
    """Give the cached buffers back to the system."""
    mx.clear_cache()


def release_models() -> None:
    """After a model was let go (a switch, an unload): free its arrays now, then the buffers they leave cached."""
    gc.collect()
    mx.clear_cache()


class Clearing:
    """When the engine loop clears: after a step that read prompt chunks, every ``CLEAR_EVERY_STEPS`` decode steps,
    and when the loop falls idle."""

    def __init__(self) -> None:
        self.steps = 0

    def after_step(self, read_prompt: bool, idle: bool) -> None:
        self.steps += 1
        if read_prompt or idle or self.steps >= CLEAR_EVERY_STEPS:
            self.steps = 0
            mx.clear_cache()

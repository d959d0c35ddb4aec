"""What the engine tunes to the device it runs on: one ``DeviceProfile`` per device kind, chosen in one place.

Shared code is shaped for the GPU our users run (Metal; MLX's CUDA backend takes
the same branches). The CPU backend keeps one fast path of its own where MLX's
CPU kernels are slow (``exp`` runs one element at a time there). Every branch
that depends on the device reads ``current()`` (its memory, ``gpu_memory()``);
nothing else asks MLX which device it is on, so a test can force the GPU's
branches on the CPU backend (``forced("gpu")``, or ``MLXCHAT_DEVICE_PROFILE=gpu``
for a subprocess).

How each CPU figure was measured, and the GPU's reasoning, are in
``docs/device-profile.md``; ``mlxchat bench`` re-measures the rows they move.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypedDict

import mlx.core as mx

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

ENV = "MLXCHAT_DEVICE_PROFILE"


@dataclass(frozen=True)
class DeviceProfile:
    kind: str  # "gpu" (Metal, CUDA) or "cpu"
    fused_attention: bool  # attention by mx.fast.scaled_dot_product_attention; else grouped products + fast_exp
    fast_exp: bool  # softmax, log-sum-exp and SiLU through fast_exp (whole-array polynomials), not MLX's exp
    prefill_chunk: int  # prompt tokens a pass while a prompt is read alone by Engine.generate or prefill()
    # Whether a pass starts each layer as soon as its graph is built (one evaluation a layer), or is one
    # evaluation (as mlx-lm's step): MLX's CPU queue is short, and a GPU pays a launch for each evaluation.
    eval_each_layer: bool
    # A batch step's token budget: decode rows count one each, prompt chunks their tokens (every chunk through
    # every layer). It trades a joining prompt's first token (fewer, larger steps) against the running streams'
    # gaps (a step with a chunk lasts as long as its rows take): docs/device-profile.md.
    step_tokens: int
    # How attention reads a paged cache's keys and values (the read paths; docs/device-profile.md):
    max_segments: int  # runs of blocks a lone sequence attends over as views; more, one gathered copy
    span_slack_slots: int  # runs in one slab read as one view while the gaps between them hold this many slots a run
    alone_cost_keys: int  # what a batch row attended on its own costs, in keys of every padded row
    # A block drafter's block (the last token and the positions it drafts): its pass and the target's verify
    # grow with it while its later positions are seldom accepted (docs/drafting.md); capped by the folder's.
    draft_block: int = 5


# Measured on the CPU, where each read of a run costs attention a few more MLX operations a layer (as much as
# hundreds of keys): docs/device-profile.md.
_CPU_READS = dict(max_segments=64, span_slack_slots=64, alone_cost_keys=512)

PROFILES = {
    # A prompt read alone goes in large chunks, as mlx-lm's 2,048-token prefill step (fewer passes, each bound
    # by compute); a step's budget of 512 tokens, the low end of the budgets chunked prefill is run with
    # (Sarathi-Serve, vLLM) for small gaps: past about 10 tokens a 4-bit layer is bound by compute
    # (docs/decisions.md, "A join on a GPU"), so a step with a chunk lasts about as long as its tokens take. Fused kernels throughout (a batch's dense rows, the
    # mirror, are one fused kernel a layer). The read thresholds are the CPU's until a GPU measures its own.
    "gpu": DeviceProfile("gpu", fused_attention=True, fast_exp=False, prefill_chunk=2048, eval_each_layer=False,
                         step_tokens=512, **_CPU_READS),
    # MLX's CPU attention over a long prefix grows with the chunk (scores of chunk x keys), so short chunks
    # read a prompt fastest; the step's budget is half the GPU's, as its passes take longer a token.
    "cpu": DeviceProfile("cpu", fused_attention=False, fast_exp=True, prefill_chunk=128, eval_each_layer=True,
                         step_tokens=256, **_CPU_READS),
}

_forced: DeviceProfile | None = None
_by_device: dict[str, DeviceProfile] = {}  # read on every decode step: the answer is kept per device


def current() -> DeviceProfile:
    """The profile of the device MLX runs on (or the one a test forced, or ``MLXCHAT_DEVICE_PROFILE`` names)."""
    if _forced is not None:
        return _forced
    device = str(mx.default_device())
    if device not in _by_device:
        name = os.environ.get(ENV) or ("cpu" if mx.default_device() == mx.cpu else "gpu")
        if name not in PROFILES:
            raise ValueError(f"{ENV} must be one of {', '.join(PROFILES)}, not {name!r}")
        _by_device[device] = PROFILES[name]
    return _by_device[device]


def gpu_memory() -> tuple[int, int | None] | None:
    """(bytes the GPU gives MLX, bytes free on it now or None) under a GPU profile; None on the CPU, whose
    arrays live in RAM, or where the device names no size. Metal names its recommended working set (else its
    memory size) and nothing free; CUDA its total memory and what every process leaves free now."""
    if current().kind != "gpu":
        return None
    info = mx.device_info()
    total = info.get("max_recommended_working_set_size") or info.get("memory_size") or info.get("total_memory")
    if not total:  # the GPU profile forced on the CPU backend
        return None
    free = info.get("free_memory")
    return int(total), None if free is None else int(free)


class ProfileChanges(TypedDict, total=False):
    """The fields ``forced`` may replace (tests send reads down one path)."""

    prefill_chunk: int
    step_tokens: int
    max_segments: int
    span_slack_slots: int
    alone_cost_keys: int
    draft_block: int


@contextmanager
def forced(name: str, **changes: Unpack[ProfileChanges]) -> Iterator[DeviceProfile]:
    """Run with the ``name`` profile's branches whatever the device (for tests: the GPU's on the CPU), its
    fields ``changes`` replaced (for tests: a threshold that sends the reads down one path)."""
    global _forced
    before, _forced = _forced, replace(PROFILES[name], **changes)
    try:
        yield _forced
    finally:
        _forced = before

"""Run a test under each device profile: ``forced("gpu")`` takes the branches Metal and CUDA take, on the CPU.

Compiled graphs keep the branch they were traced with, so a test that compiles
(``CompiledForward``) takes its forward from ``forward_for`` (one per profile).
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest

from mlxcore import device_profile
from mlxcore.compiled_forward import CompiledForward

_forwards: dict[tuple[int, str], CompiledForward] = {}


@pytest.fixture(params=["cpu", "gpu"])
def profile(request, monkeypatch):
    """The test runs once with the CPU's branches and once with the GPU's."""
    # Through the test's monkeypatch, as ``tuned`` is: undone in reverse order, the device's own comes back.
    monkeypatch.setattr(device_profile, "_forced", device_profile.PROFILES[request.param])
    return device_profile.current()


def tuned(monkeypatch, **changes: int) -> None:
    """For the rest of the test, the profile in force with ``changes`` (a threshold that sends reads one way)."""
    monkeypatch.setattr(device_profile, "_forced", dataclasses.replace(device_profile.current(), **changes))


def forward_for(model) -> CompiledForward:
    """``model``'s compiled forward, traced under the profile in force now."""
    key = (id(model), device_profile.current().kind)
    if key not in _forwards:
        _forwards[key] = CompiledForward(model)
    return _forwards[key]


@pytest.fixture
def blocked_calls(monkeypatch) -> list[tuple]:
    """The shapes of queries attended in the CPU's key blocks (``cpu_attention``) while the test runs."""
    import mlxcore.decode_attention as decode_attention
    calls, real = [], decode_attention.segmented_causal_attention

    def spy(q, *args):
        calls.append(q.shape)
        return real(q, *args)
    monkeypatch.setattr(decode_attention, "segmented_causal_attention", spy)
    return calls


@pytest.fixture
def fused_calls(monkeypatch) -> list[tuple]:
    """The shapes of queries given to MLX's fused attention while the test runs."""
    calls, fused = [], mx.fast.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        calls.append(q.shape)
        return fused(q, *args, **kwargs)
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", spy)
    return calls

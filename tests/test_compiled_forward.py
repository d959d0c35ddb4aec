"""The batched pass's rows (``forward_rows``: a lone decode row, a verification block) give the model's own logits, to float32 rounding, on every cache kind.

Its attention (``decode_attention.py``) sums in another order than MLX's on the
CPU, so logits and later layers' cache contents agree to ~1e-6, not bit for bit;
the tolerance below is 100x that and far below any logit gap that matters.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxcore.batching.batch_forward import forward_rows, warm_up
from mlxcore.decode_attention import run_attention
from mlxcore.compile_support import compile_works
from mlxcore.compiled_forward import MAX_COMPILED_TOKENS, CompiledForward, has_split_layers
from mlxcore.kv.model_cache import make_model_cache
from mlxcore.loading import load_model
from tests.tiny_models import tiny_qwen3, tiny_qwen3_moe

pytestmark = pytest.mark.skipif(not compile_works(), reason="mx.compile does not run on this machine")

# Lengths a decoder feeds: prompt chunk, single steps, verification blocks of several sizes.
SCHEDULE = [7, 1, 1, 5, 1, 9, 1, 1, 3, 1, 2, 1]
ATOL = 1e-4


def _feed_both(model: nn.Module, kind: str, schedule: list[int], trims: bool = False, **cache_args) -> None:
    """Feed the same tokens to the model and to the batched pass's rows, each on its own cache; compare."""
    forward = CompiledForward(model)
    assert forward.enabled
    plain_cache = make_model_cache(model, kind, **cache_args)
    fast_cache = make_model_cache(model, kind, **cache_args)
    token, held = 3, []
    for step, n in enumerate(schedule):
        ids = [(token + 7 * i) % model.args.vocab_size for i in range(n)]
        held += ids
        plain_cache.begin(n)
        expected = model(mx.array([ids]), cache=plain_cache.layers)
        got = forward_rows(forward, fast_cache, ids)[None]
        np.testing.assert_allclose(np.array(got), np.array(expected), atol=ATOL, rtol=ATOL,
                                   err_msg=f"logits differ at step {step} ({kind}, {n} tokens)")
        token = int(mx.argmax(expected[0, -1]).item())
        if trims and n > 2:  # a rejected draft: rewind both the same way
            plain_cache.trim(n - 2)
            fast_cache.trim(n - 2)
            del held[plain_cache.offset:]
    (plain_tensors, plain_meta), (fast_tensors, fast_meta) = plain_cache.state_dict(held), fast_cache.state_dict(held)
    assert plain_meta == fast_meta and plain_tensors.keys() == fast_tensors.keys()
    for name in plain_tensors:
        np.testing.assert_allclose(np.array(fast_tensors[name]), np.array(plain_tensors[name]), atol=ATOL, rtol=ATOL,
                                   err_msg=f"cache tensor {name} differs ({kind})")


@pytest.mark.parametrize("kind", ["standard", "paged"])
def test_tiny_qwen3_logits_and_caches_equal(kind):
    _feed_both(tiny_qwen3(seed=1), kind, SCHEDULE * 3, trims=True)


@pytest.mark.parametrize("kind", ["standard", "paged"])
def test_tiny_qwen3_moe_logits_and_caches_equal(kind):
    """Qwen3-MoE runs split too (its expert block as mlx-lm has it), so the scheduler can batch it."""
    model = tiny_qwen3_moe(seed=9)
    assert CompiledForward(model).split
    _feed_both(model, kind, SCHEDULE * 2, trims=True)


def test_rotating_cache_after_wrap_equal():
    _feed_both(tiny_qwen3(seed=2), "rotating", SCHEDULE * 4, trims=True, max_kv=24, keep=4)


@pytest.mark.parametrize("name", ["mini-target", "mini-draft", "mini-target-4bit"])
def test_embedded_models_equal(name):
    _feed_both(load_model(name).model, "paged", SCHEDULE * 2)


@pytest.mark.parametrize("kind", ["standard", "paged"])
def test_long_inputs_run_the_same_layers_uncompiled(kind, monkeypatch):
    """Rows past the compiled counts build no kernels for their count: the layers run uncompiled (the
    model's own forward is not called either), with the model's logits."""
    model = tiny_qwen3(seed=3)
    forward = CompiledForward(model)
    monkeypatch.setattr(forward, "wrapped", None)  # calling the model's own forward would fail
    compiled = []
    for layer in forward._layers:
        monkeypatch.setattr(layer, "before_batch", lambda *args, real=layer.before_batch: compiled.append(1) or real(*args))
    ids = np.random.default_rng(3).integers(0, model.args.vocab_size, (1, MAX_COMPILED_TOKENS + 30)).tolist()
    ours, theirs = make_model_cache(model, kind), make_model_cache(model, kind)
    theirs.begin(len(ids[0]))
    got = forward_rows(forward, ours, ids[0])
    np.testing.assert_allclose(np.array(got), np.array(model(mx.array(ids), cache=theirs.layers))[0], atol=ATOL)
    assert not compiled
    forward_rows(forward, ours, [5])
    assert len(compiled) == len(forward._layers)


def test_other_architectures_are_left_alone(monkeypatch):
    model = tiny_qwen3(seed=4)
    monkeypatch.setattr(model.args, "model_type", "llama")
    assert not has_split_layers(model)
    assert not CompiledForward(model).enabled


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("MLXCHAT_COMPILE", "0")
    compile_works.cache_clear()
    try:
        assert not CompiledForward(tiny_qwen3(seed=5)).enabled
    finally:
        monkeypatch.delenv("MLXCHAT_COMPILE")
        compile_works.cache_clear()


class _CountingNorm(nn.Module):
    """Wraps a layer's input norm; its Python body runs only while mx.compile traces."""

    def __init__(self, norm: nn.Module, traced: list) -> None:
        super().__init__()
        self.norm, self.traced = norm, traced

    def __call__(self, x: mx.array) -> mx.array:
        self.traced.append(x.shape[0])  # rows
        return self.norm(x)


def test_warm_up_traces_one_and_two_rows_once():
    model = tiny_qwen3(seed=6)
    traced: list[int] = []
    model.model.layers[0].input_layernorm = _CountingNorm(model.model.layers[0].input_layernorm, traced)
    forward = CompiledForward(model)
    run_attention.cache_clear()  # built by the warm-up, not by an earlier test
    warm_up(forward)
    assert sorted(traced) == [1, 2], "a lone decode row, and two rows (a batch of two, a verification of one token)"
    built = run_attention.cache_info().misses  # (cleared before the warm-up)
    cache = make_model_cache(model, "paged")  # a real decode afterwards: no new trace, nor attention to build
    for ids in ([5], [6, 7], [8]):
        mx.eval(forward_rows(forward, cache, ids))
    assert sorted(traced) == [1, 2] and run_attention.cache_info().misses == built


def test_warm_up_leaves_engine_state_alone():
    from mlxcore.engine import Engine
    from mlxcore.params import GenerationParams
    engine = Engine(tiny_qwen3(seed=7), draft_model=tiny_qwen3(seed=8))
    before = vars(engine.draft_control).copy()
    engine.warm_up()
    assert vars(engine.draft_control) == before and engine.pools == {}
    caches = engine.new_caches()
    list(engine.generate([1, 2, 3], caches, GenerationParams(max_tokens=6)))
    assert caches.target.offset == caches.draft.offset == 3 + engine.last_stats.generated_tokens

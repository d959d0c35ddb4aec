"""The CPU prefill forward (cheaper exp) against mlx-lm's own model on mlx-lm's caches."""

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.cpu_prefill import cpu_prefill_body, uses_cpu_prefill
from mlxcore.loading import load_model
from tiny_models import tiny_qwen3


def chunked(body, model, ids, chunk, cache):
    """Final hidden states of every chunk, fed in order through ``body`` into ``cache``."""
    outputs = []
    for start in range(0, len(ids), chunk):
        outputs.append(body(model, mx.array(ids[start:start + chunk])[None], cache))
        mx.eval(outputs[-1])
    return outputs


def mlx_lm_body(model, inputs, cache):
    return model.model(inputs, cache=cache)


@pytest.mark.parametrize("heads,kv_heads,chunk,max_kv", [(4, 2, 48, None), (4, 4, 200, None), (6, 2, 1, None),
                                                         (4, 2, 32, 64)])
def test_hidden_states_and_caches_match_mlx_lm(heads, kv_heads, chunk, max_kv):
    """Grouped and plain heads, one chunk or several (queries after a prefix), one token at a time,
    and mlx-lm's rotating cache (its window mask takes the model's own attention)."""
    model = tiny_qwen3(seed=5, layers=3, heads=heads, kv_heads=kv_heads)
    ids = np.random.default_rng(1).integers(0, model.args.vocab_size, 150).tolist()
    ours_cache, ref_cache = make_prompt_cache(model, max_kv), make_prompt_cache(model, max_kv)
    assert uses_cpu_prefill(model, ours_cache)
    ours = chunked(cpu_prefill_body, model, ids, chunk, ours_cache)
    reference = chunked(mlx_lm_body, model, ids, chunk, ref_cache)
    for i, (a, b) in enumerate(zip(ours, reference)):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-5, err_msg=f"chunk {i} differs")
    for i, (a, b) in enumerate(zip(ours_cache, ref_cache)):
        assert a.offset == b.offset
        for name, x, y in zip(("keys", "values"), a.state, b.state):
            np.testing.assert_allclose(np.array(x), np.array(y), rtol=1e-5, atol=1e-5,
                                       err_msg=f"layer {i} {name} differ")


def test_applies_to_the_float32_target_only():
    target = load_model("mini-target").model
    assert uses_cpu_prefill(target, make_prompt_cache(target))
    quantized = load_model("mini-target-4bit").model  # its exp-heavy steps are not the float32 ones
    assert not uses_cpu_prefill(quantized, make_prompt_cache(quantized))

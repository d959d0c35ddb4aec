"""The CPU prefill forward (cheaper exp) against mlx-lm's own model on mlx-lm's caches."""

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.cpu_attention import MIN_KEYS_PER_BLOCK, QUERIES_PER_PASS, SCORES_PER_BLOCK
from mlxcore.cpu_prefill import cpu_prefill_body, uses_cpu_prefill
from mlxcore.kv.model_cache import make_model_cache
from mlxcore.loading import load_model
from mlxcore.prefill import prefill
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
    assert_same_caches(ours_cache, ref_cache)


# The 8B's attention: 32 query heads over 8 KV heads (narrow head and hidden sizes keep it quick).
WIDE = {"layers": 2, "hidden": 64, "heads": 32, "kv_heads": 8, "head_dim": 16}
# Keys per block for a full chunk of the wide model; a prompt of 2.2 blocks' worth of tokens passes every
# change of blocking: several KV heads a block (the first chunks), one KV head with 1, 2, then 3 key blocks.
WIDE_KEYS = max(MIN_KEYS_PER_BLOCK, SCORES_PER_BLOCK // (WIDE["heads"] // WIDE["kv_heads"] * QUERIES_PER_PASS))
WIDE_PROMPT = int(2.2 * WIDE_KEYS)


def assert_same_caches(ours, reference):
    """Layer by layer, the keys and values the caches hold (mlx-lm's buffers run past the offset)."""
    for i, (a, b) in enumerate(zip(ours, reference)):
        assert a.offset == b.offset
        for name, x, y in zip(("keys", "values"), a.state, b.state):
            x, y = x[..., :a.offset, :], y[..., :b.offset, :]
            np.testing.assert_allclose(np.array(x), np.array(y), rtol=1e-5, atol=1e-5,
                                       err_msg=f"layer {i} {name} differ")


@pytest.mark.parametrize("chunk", [QUERIES_PER_PASS, 2 * QUERIES_PER_PASS + 44])  # the default; passes
def test_wide_heads_at_long_context_match_mlx_lm(chunk):
    model = tiny_qwen3(seed=3, **WIDE)
    ids = np.random.default_rng(2).integers(0, model.args.vocab_size, WIDE_PROMPT).tolist()
    ours_cache, ref_cache = make_prompt_cache(model), make_prompt_cache(model)
    ours = chunked(cpu_prefill_body, model, ids, chunk, ours_cache)
    reference = chunked(mlx_lm_body, model, ids, chunk, ref_cache)
    for i, (a, b) in enumerate(zip(ours, reference)):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-5, err_msg=f"chunk {i} differs")
    assert_same_caches(ours_cache, ref_cache)


def test_wide_heads_prefill_into_the_paged_cache_matches_mlx_lm():
    """The Engine's path: ``prefill`` into the default paged cache, against mlx-lm's forward into its KVCache."""
    model = tiny_qwen3(seed=4, **WIDE)
    ids = np.random.default_rng(3).integers(0, model.args.vocab_size, WIDE_KEYS + 100).tolist()  # 2 key blocks
    ours = make_model_cache(model, "paged")
    assert uses_cpu_prefill(model, ours.layers)
    prefill(model, ours, ids, chunk=QUERIES_PER_PASS)
    reference = make_prompt_cache(model)
    chunked(mlx_lm_body, model, ids, QUERIES_PER_PASS, reference)
    assert_same_caches(ours.layers, reference)


def test_applies_to_the_float32_target_only():
    target = load_model("mini-target").model
    assert uses_cpu_prefill(target, make_prompt_cache(target))
    quantized = load_model("mini-target-4bit").model  # its exp-heavy steps are not the float32 ones
    assert not uses_cpu_prefill(quantized, make_prompt_cache(quantized))

"""Prompt chunks read as rows of the batched pass (``PromptFeed``, ``BatchDecoder``: the one prefill path, the
runner's and ``prefill()``'s) against mlx-lm's own model on its caches, under the CPU's branches (key-block
attention, SiLU through fast_exp) and the GPU's (fused attention)."""

import mlxcore  # noqa: F401
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.batching.batch_forward import BatchDecoder
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.cpu_attention import MIN_KEYS_PER_BLOCK, QUERIES_PER_PASS, SCORES_PER_BLOCK
from mlxcore.kv.model_cache import make_model_cache
from mlxcore.loading import load_model
from mlxcore.prefill import prefill
from device_profiles import forward_for, profile  # noqa: F401
from tiny_models import tiny_qwen3, tiny_qwen3_moe


def chunked(read, ids, chunk, cache):
    """Final hidden states of every chunk, fed in order through ``read`` into ``cache``."""
    outputs = []
    for start in range(0, len(ids), chunk):
        outputs.append(read(ids[start:start + chunk], cache))
        mx.eval(outputs[-1])
    return outputs


def ours_rows(model):
    """A chunk read as rows of the batched pass alone (traced under the profile in force), its final hidden
    states (1, L, hidden) normed as mlx-lm's body ends; ``chunk`` of the layers never runs."""
    forward = forward_for(model)

    def read(ids, cache):
        feed = PromptFeed(forward, cache, ids)
        BatchDecoder(forward)([], None, [feed])
        feed.ran()
        return model.model.norm(feed.h.transpose(1, 0, 2))
    return read


def mlx_lm_body(model):
    return lambda ids, cache: model.model(mx.array(ids)[None], cache=cache)


@pytest.mark.parametrize("heads,kv_heads,chunk,max_kv", [(4, 2, 48, None), (4, 4, 200, None), (6, 2, 1, None),
                                                         (4, 2, 32, 64)])
def test_hidden_states_and_caches_match_mlx_lm(heads, kv_heads, chunk, max_kv, profile):  # noqa: F811
    """Grouped and plain heads, one chunk or several (queries after a prefix), one token at a time (the
    compiled layers), and mlx-lm's rotating cache (its window mask)."""
    model = tiny_qwen3(seed=5, layers=3, heads=heads, kv_heads=kv_heads)
    ids = np.random.default_rng(1).integers(0, model.args.vocab_size, 150).tolist()
    kind = "standard" if max_kv is None else "rotating"
    ours_cache = make_model_cache(model, kind, max_kv=max_kv)
    # A window: mlx-lm's model over a rotating cache of ours (its mask and reads, through the cache protocol).
    ref_cache = make_prompt_cache(model) if max_kv is None else make_model_cache(model, kind, max_kv=max_kv)
    ref_layers = ref_cache if max_kv is None else ref_cache.layers
    ours = chunked(ours_rows(model), ids, chunk, ours_cache)
    reference = chunked(mlx_lm_body(model), ids, chunk, ref_layers)
    for i, (a, b) in enumerate(zip(ours, reference)):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-5, err_msg=f"chunk {i} differs")
    assert_same_caches(ours_cache.layers, ref_layers)


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
def test_wide_heads_at_long_context_match_mlx_lm(chunk, profile):  # noqa: F811
    model = tiny_qwen3(seed=3, **WIDE)
    ids = np.random.default_rng(2).integers(0, model.args.vocab_size, WIDE_PROMPT).tolist()
    ours_cache, ref_cache = make_model_cache(model, "paged"), make_prompt_cache(model)
    ours = chunked(ours_rows(model), ids, chunk, ours_cache)
    reference = chunked(mlx_lm_body(model), ids, chunk, ref_cache)
    for i, (a, b) in enumerate(zip(ours, reference)):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-5, err_msg=f"chunk {i} differs")
    assert_same_caches(ours_cache.layers, ref_cache)


def test_wide_heads_prefill_into_the_paged_cache_matches_mlx_lm(profile):  # noqa: F811
    """The Engine's path: ``prefill`` into the default paged cache, against mlx-lm's forward into its KVCache."""
    model = tiny_qwen3(seed=4, **WIDE)
    ids = np.random.default_rng(3).integers(0, model.args.vocab_size, WIDE_KEYS + 100).tolist()  # 2 key blocks
    ours = make_model_cache(model, "paged")
    prefill(forward_for(model), ours, ids, chunk=QUERIES_PER_PASS)
    reference = make_prompt_cache(model)
    chunked(mlx_lm_body(model), ids, QUERIES_PER_PASS, reference)
    assert_same_caches(ours.layers, reference)


def test_the_4bit_target_reads_a_prompt_as_mlx_lm(profile):  # noqa: F811
    """Quantized weights take the same layers (MLX's SiLU: fast_exp is for float32 activations only)."""
    model = load_model("mini-target-4bit").model
    ids = np.random.default_rng(4).integers(0, model.args.vocab_size, 300).tolist()
    ours, reference = make_model_cache(model, "paged"), make_prompt_cache(model)
    prefill(forward_for(model), ours, ids, chunk=128)
    chunked(mlx_lm_body(model), ids, 128, reference)
    assert_same_caches(ours.layers, reference)


def test_a_qwen3_moe_model_reads_a_prompt_as_mlx_lm(profile):  # noqa: F811
    """Qwen3-MoE's layers run split too: its expert block as mlx-lm calls it, around our attention."""
    model = tiny_qwen3_moe(seed=6)
    ids = np.random.default_rng(5).integers(0, model.args.vocab_size, 130).tolist()
    ours, reference = make_model_cache(model, "paged"), make_prompt_cache(model)
    prefill(forward_for(model), ours, ids, chunk=48)
    chunked(mlx_lm_body(model), ids, 48, reference)
    assert_same_caches(ours.layers, reference)

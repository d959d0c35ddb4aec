"""The paged cache with 8-bit keys and values: against mlx-lm's QuantizedKVCache, the float cache, and itself.

mlx-lm's ``QuantizedKVCache`` (the reference we did not write) quantizes each token with ``mx.quantize``
as ours does: the first layer's stored keys and values (which only the prompt decides) are bit for bit
the same, later layers' agree after dequantizing (their inputs went through attention computed in
another order), and so do the logits.
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import QuantizedKVCache

from mlxcore.batching.batch_forward import forward_rows
from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from mlxcore.compiled_forward import CompiledForward
from mlxcore.configs import KVConfig
from mlxcore.engine import Engine
from mlxcore.events import TokenEvent
from mlxcore.kv.kv_format import KVFormatError, kv_format
from mlxcore.kv.model_cache import ModelCache, make_block_pool, make_model_cache
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from tiny_models import tiny_qwen3

MODEL = tiny_qwen3(seed=31, head_dim=32)
FORWARD = CompiledForward(MODEL)
TARGET, DRAFT = load_model("mini-target"), load_model("mini-draft")


def ids(count: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, MODEL.args.vocab_size, count)]


def feed(forward, cache, tokens: list[int]) -> np.ndarray:
    """Ours (a ``CompiledForward``): rows of the batched pass; mlx-lm's model on its own caches."""
    if isinstance(forward, CompiledForward):
        logits = forward_rows(forward, cache, tokens)[-1]
    else:
        if hasattr(cache, "begin"):
            cache.begin(len(tokens))
        logits = forward(mx.array([tokens]), cache=cache.layers if hasattr(cache, "layers") else cache)[0, -1]
    mx.eval(logits)
    return np.array(logits)


def test_stored_blocks_and_logits_match_mlx_lms_quantized_cache():
    prompt = ids(150, 1)
    ours = make_model_cache(MODEL, "paged", kv_bits=8)
    theirs = [QuantizedKVCache(group_size=32, bits=8) for _ in MODEL.model.layers]
    np.testing.assert_allclose(feed(MODEL, ours, prompt), feed(MODEL, theirs, prompt), atol=2e-3)
    token, held = prompt[-1], list(prompt)
    for step in range(12):  # decode through our compiled path (quantized matmuls over the runs)
        mine, reference = feed(FORWARD, ours, [token]), feed(MODEL, theirs, [token])
        np.testing.assert_allclose(mine, reference, atol=2e-3, err_msg=f"decode step {step}")
        held.append(token)
        token = int(reference.argmax())
    tensors, meta = ours.state_dict(held)
    assert meta["kv_format"] == "q8g32" and tensors["0.keys"].dtype == mx.uint32
    first_keys = theirs[0].keys
    offset = theirs[0].offset
    for name, part in (("0.keys", 0), ("0.keys.scales", 1), ("0.keys.biases", 2)):
        assert mx.array_equal(tensors[name], first_keys[part][..., :offset, :]).item(), name
    for layer in range(1, len(MODEL.model.layers)):
        mine = mx.dequantize(*(tensors[f"{layer}.keys{s}"] for s in ("", ".scales", ".biases")), group_size=32, bits=8)
        ref = mx.dequantize(*(p[..., :offset, :] for p in theirs[layer].keys), group_size=32, bits=8)
        np.testing.assert_allclose(np.array(mine), np.array(ref), atol=0.05)


ONE_LAYER = tiny_qwen3(seed=32, head_dim=32, layers=1)  # its keys and values depend on the tokens alone


def test_fork_rewind_and_restore_equal_the_same_operations_in_one_quantized_run():
    """Stored blocks bit for bit (a one-layer model: a deeper one's later layers take attention outputs that
    differ by summation order between two runs of blocks and one); logits to float rounding."""
    model, forward = ONE_LAYER, CompiledForward(ONE_LAYER)
    pool = make_block_pool(model, block_size=4, kv_bits=8)
    prompt = ids(37, 2)
    parent = make_model_cache(model, "paged", pool=pool, block_size=4)
    feed(model, parent, prompt)
    child = parent.fork()  # shares the prompt's blocks; the partial tail is copied on write
    reference = make_model_cache(model, "paged", kv_bits=8, block_size=4)
    feed(model, reference, prompt)
    for cache in (child, reference):
        feed(forward, cache, [5, 6, 7])
        assert cache.trim(2) == 2  # a rejected draft
    # the fork reads two runs of blocks, the reference one: the same numbers summed in another order
    np.testing.assert_allclose(feed(forward, child, [9]), feed(forward, reference, [9]), atol=1e-5)
    held = prompt + [5, 9]
    assert_same_state(child, reference, held)
    tensors, meta = child.state_dict(held)
    restored = ModelCache.from_state(model, tensors, meta, pool=make_block_pool(model, kv_bits=8))
    assert_same_state(restored, reference, held)
    np.testing.assert_allclose(feed(forward, restored, [11]), feed(forward, reference, [11]), atol=1e-5)
    feed(forward, parent, [5])  # the parent goes on from the shared blocks, unchanged by its child
    assert parent.offset == len(prompt) + 1


def assert_same_state(cache, reference, ids: list[int]) -> None:
    """The same length, and bit for bit the same stored (quantized) keys and values."""
    (mine, _), (theirs, _) = cache.state_dict(ids), reference.state_dict(ids)
    assert cache.offset == reference.offset and mine.keys() == theirs.keys()
    assert all(mx.array_equal(mine[name], theirs[name]).item() for name in mine)


def test_quantized_blocks_hold_a_third_of_the_float_bytes():
    float_pool, q8_pool = make_block_pool(MODEL), make_block_pool(MODEL, kv_bits=8)
    # head size 32, float32: 128 bytes a head and token; 8-bit: 32 bytes + a float32 scale and bias
    assert q8_pool.geometry.token_bytes / float_pool.geometry.token_bytes == pytest.approx(40 / 128)
    for pool in (float_pool, q8_pool):
        cache = make_model_cache(MODEL, "paged", pool=pool)
        feed(MODEL, cache, ids(100, 3))
    assert q8_pool.kv_bytes == sum(layer.nbytes for layer in q8_pool.storage)


def test_unsupported_formats_are_typed_errors():
    with pytest.raises(KVFormatError, match="4-bit"):
        kv_format(4, 128)
    with pytest.raises(KVFormatError, match="divisible"):
        kv_format(8, 48)
    assert kv_format(8, 128).group_size == 64 and kv_format(8, 32).group_size == 32
    with pytest.raises(ValueError, match='kind="paged" or kind="rotating"'):
        KVConfig(kind="standard", kv_bits=8)


def engine(bits: int | None, draft: bool = False) -> Engine:
    made = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind="paged", kv_bits=bits),
                  draft_model=DRAFT.model if draft else None)
    made.eos_ids = set()
    return made


def generate(made: Engine, prompt: list[int], tokens: int) -> list[int]:
    params = GenerationParams(max_tokens=tokens)
    return [e.token for e in made.generate(prompt, made.new_caches(), params) if isinstance(e, TokenEvent)]


def test_speculative_greedy_equals_plain_with_8_bit_kv():
    prompt = TARGET.tokenizer.encode("Once upon a time there was a little cat who liked to play in the garden.")
    spec = engine(8, draft=True)
    assert generate(spec, prompt, 80) == generate(engine(8), prompt, 80)
    assert spec.last_stats.draft_accepted > 0


def test_batched_8_bit_replies_equal_each_alone():
    prompts = [ids(20 + 17 * s, 10 + s) for s in range(5)]
    batch = LocalBatch(engine(8))
    params = GenerationParams(max_tokens=20)
    handles = [batch.submit(Request(tuple(p), params))[0] for p in prompts]
    got = [[] for _ in handles]
    while batch.busy:
        batch.step()
        for tokens, handle in zip(got, handles):
            tokens.extend(e.token for e in drain(handle) if isinstance(e, TokenEvent))
    for tokens, p in zip(got, prompts):
        assert tokens == generate(engine(8), p, 20)


def test_speculative_greedy_equals_plain_on_an_8_bit_rotating_window_after_it_wrapped():
    prompt = TARGET.tokenizer.encode("Once upon a time there was a little cat who liked to play in the garden.")

    def rotating(draft: bool) -> Engine:
        made = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind="rotating", max_kv=48, kv_bits=8),
                      draft_model=DRAFT.model if draft else None)
        made.eos_ids = set()
        return made

    spec, plain = rotating(True), rotating(False)
    caches = spec.new_caches()
    spec_tokens = [e.token for e in spec.generate(prompt, caches, GenerationParams(max_tokens=120))
                   if isinstance(e, TokenEvent)]
    assert caches.target.layers[0].wrapped and caches.target.layers[0].bits == 8
    assert spec_tokens == generate(plain, prompt, 120)
    assert spec.last_stats.draft_accepted > 0


def test_an_8_bit_rotating_window_saves_and_restores_as_stored():
    cache = make_model_cache(MODEL, "rotating", max_kv=40, keep=4, kv_bits=8)
    held = []
    for start in range(0, 90, 9):  # past the window: it wrapped
        held += ids(9, 40 + start)
        feed(MODEL, cache, held[-9:])
    tensors, meta = cache.state_dict(held)
    assert meta["kv_format"] == "q8g32" and tensors["0.keys"].dtype == mx.uint32
    restored = ModelCache.from_state(MODEL, tensors, meta)
    assert_same_state(restored, cache, held)
    np.testing.assert_array_equal(feed(FORWARD, restored, [3]), feed(FORWARD, cache, [3]))

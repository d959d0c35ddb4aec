"""The GPU's branches, run on the CPU backend (``device_profile.forced("gpu")``): fused attention for one
sequence and for a batch's padded rows, MLX's exp in the sampler, prefill through the model as it is, the
device's chunk sizes. Each is checked against the CPU's branch and against MLX's own attention or mlx-lm's
generation, on random tensors, the embedded pair and the 0.6B twin (4-bit, bf16 scales, 151,936 tokens)."""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from mlxcore import device_profile
from mlxcore.batching.batch_forward import forward_rows
from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from mlxcore.decode_attention import attend_parts, batch_attention, dequantized, normalized
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.kv.model_cache import make_block_pool, make_model_cache
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams, SamplingParams
from mlxcore.prefill import prefill
from mlxcore.sampling import KeyStream
from mlxcore.sampling_graphs import greedy_pick, sampled_pick
from device_profiles import blocked_calls, forward_for, fused_calls  # noqa: F401
from twin_fixtures import twin_06b, twins_root  # noqa: F401

HEADS, KV_HEADS, DIM = 8, 2, 64
SCALE = DIM ** -0.5


def tensors(seed: int, batch: int, queries: int, keys: int) -> tuple[mx.array, mx.array, mx.array]:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(shape).astype(np.float32)
               for shape in ((batch, HEADS, queries, DIM), (batch, KV_HEADS, keys, DIM), (batch, KV_HEADS, keys, DIM)))
    return mx.array(q), mx.array(k), mx.array(v)


def split(keys: mx.array, values: mx.array, cuts: list[int]) -> list[tuple[mx.array, mx.array]]:
    bounds = [0, *cuts, keys.shape[2]]
    return [(keys[:, :, a:b], values[:, :, a:b]) for a, b in zip(bounds, bounds[1:])]


def quantized(segments):
    return [tuple(tuple(mx.quantize(x, group_size=32, bits=8)) for x in pair) for pair in segments]


def gapped_mask(keys: int) -> mx.array:
    """(1, keys) booleans: a span read whose gaps between runs are masked out."""
    seen = np.ones(keys, bool)
    seen[10:14] = seen[25:27] = False
    return mx.array(seen[None])


CASES = {  # name: (queries, cuts between segments, mask, quantized)
    "one segment": (1, [], None, False),
    "three segments": (1, [13, 29], None, False),
    "verification block, causal": (5, [17], "causal", False),
    "span with gaps": (1, [], "gapped", False),
    "8-bit keys and values": (1, [21], None, True),
}


@pytest.mark.parametrize("case", CASES)
def test_one_sequence_attention_agrees_across_profiles_and_with_mlx(case, fused_calls):
    queries, cuts, mask, packed = CASES[case]
    q, k, v = tensors(1, 1, queries, 40)
    mask = gapped_mask(40) if mask == "gapped" else mask
    segments = split(k, v, cuts)
    if packed:
        segments = quantized(segments)
        k, v = (mx.concatenate(parts, axis=2) for parts in zip(*dequantized(segments, DIM)))
    expected = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=mask))
    for kind in device_profile.PROFILES:
        fused_calls.clear()
        with device_profile.forced(kind):
            parts = attend_parts(q, segments, SCALE, mask)
            np.testing.assert_allclose(np.array(normalized(parts, q.shape)), expected, atol=2e-5,
                                       err_msg=f"{kind} profile, {case}")
        fuses = kind == "gpu" and len(segments) == 1 and not packed  # the GPU fuses one float segment, only that
        assert len(fused_calls) == fuses, f"{kind} profile, {case}"


@pytest.mark.parametrize("cuts,packed", [([], False), ([700], False), ([700], True)])
def test_a_long_prompt_chunk_attends_in_key_blocks_on_the_cpu_only(cuts, packed, fused_calls, blocked_calls):
    """128 queries, the last of 1,200 keys: too many scores for one of ``cpu_attention``'s key blocks, and
    more than the keys and values weigh, so the GPU joins float runs for its fused kernel."""
    blocked = blocked_calls
    q, k, v = tensors(3, 1, 128, 1200)
    segments = split(k, v, cuts)
    if packed:
        segments = quantized(segments)
        k, v = (mx.concatenate(parts, axis=2) for parts in zip(*dequantized(segments, DIM)))
    expected = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask="causal"))
    for kind in device_profile.PROFILES:
        fused_calls.clear(), blocked.clear()
        with device_profile.forced(kind):
            parts = attend_parts(q, segments, SCALE, "causal")
            np.testing.assert_allclose(np.array(normalized(parts, q.shape)), expected, atol=2e-5,
                                       err_msg=f"{kind} profile")
        assert blocked == ([q.shape] if kind == "cpu" else []), kind
        assert len(fused_calls) == (kind == "gpu" and not packed), kind


@pytest.mark.parametrize("packed", [False, True])
def test_a_batchs_padded_rows_attend_as_each_row_alone(packed, fused_calls):
    """Rows of 40 keys of which the first 9, 23, 40 and 31 are held (the rest padding)."""
    q, k, v = tensors(2, 4, 1, 40)
    held = [9, 23, 40, 31]
    valid = mx.array((np.arange(40)[None] < np.array(held)[:, None])[:, None, None, :])
    segments = [(k, v)] if not packed else quantized([(k, v)])
    rows_k, rows_v = (k, v) if not packed else dequantized(segments, DIM)[0]
    expected = np.concatenate([np.array(mx.fast.scaled_dot_product_attention(
        q[b:b + 1], rows_k[b:b + 1, :, :n], rows_v[b:b + 1, :, :n], scale=SCALE)) for b, n in enumerate(held)])
    for kind in device_profile.PROFILES:
        fused_calls.clear()
        with device_profile.forced(kind):
            parts = batch_attention(valid, packed, SCALE)(q, segments)
            np.testing.assert_allclose(np.array(normalized(parts, q.shape)), expected, atol=2e-5,
                                       err_msg=f"{kind} profile")
        assert fused_calls == ([q.shape] if kind == "gpu" and not packed else []), "the GPU's float rows go fused"


def test_the_sampler_picks_the_same_tokens_with_either_exp():
    """At the users' vocabulary and Qwen3's sampling: the same draws from the same keys, and log-probabilities
    equal to MLX's log-softmax, whichever exp the profile takes."""
    logits = mx.array(np.random.default_rng(3).standard_normal((3, 151_936)).astype(np.float32) * 4)
    reference = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    params = SamplingParams(temperature=0.6, top_p=0.95, top_k=20, seed=7)
    picks = {}
    for kind in device_profile.PROFILES:
        with device_profile.forced(kind):
            greedy, greedy_lp = greedy_pick()(logits, logits)
            fn, scalars = sampled_pick([params] * 3)
            keys = [KeyStream(params.seed + row) for row in range(3)]
            drawn = [fn(logits, logits, mx.stack([k.next() for k in keys]), *scalars) for _ in range(5)]
            picks[kind] = (greedy.tolist(), [t.tolist() for t, _ in drawn])
            for token, logprob in [(greedy, greedy_lp)] + drawn:
                np.testing.assert_allclose(np.array(logprob), np.array(mx.take_along_axis(
                    reference, token[:, None], axis=-1)[:, 0]), atol=2e-5, err_msg=f"{kind} profile")
    assert picks["cpu"] == picks["gpu"]
    assert greedy.tolist() == np.argmax(np.array(logits), axis=-1).tolist()


def mlx_lm_tokens(model, prompt: list[int], n: int) -> list[int]:
    return [t for t, _ in generate_step(mx.array(prompt), model, max_tokens=n, prompt_cache=make_prompt_cache(model))]


def engine_tokens(loaded, prompt: list[int], n: int, kind: str, draft=None) -> list[int]:
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind=kind), draft_model=draft)
    engine.eos_ids = set()
    events = engine.generate(prompt, engine.new_caches(), GenerationParams(max_tokens=n))
    return [e.token for e in events if isinstance(e, TokenEvent)]


def batched_tokens(loaded, prompts: list[list[int]], n: int) -> list[list[int]]:
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged"))
    engine.eos_ids = set()
    batch = LocalBatch(engine)
    handles = [batch.submit(Request(tuple(p), GenerationParams(max_tokens=n)))[0] for p in prompts]
    got = [[] for _ in handles]
    while batch.busy:
        batch.step()
        for tokens, handle in zip(got, handles):
            tokens.extend(e.token for e in drain(handle) if isinstance(e, TokenEvent))
    return got


def prompt_of(vocab: int, seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, vocab, length).tolist()


def test_the_embedded_pair_under_the_gpu_profile_decodes_as_mlx_lm():
    """A 300-token prompt (one 2,048-token prefill chunk on the GPU, three of 128 on the CPU): plain paged and
    standard, speculative with the draft, and three prompts batched, each as mlx-lm's generation."""
    target, draft = load_model("mini-target"), load_model("mini-draft")
    prompts = [prompt_of(target.model.args.vocab_size, s, n) for s, n in ((0, 300), (1, 45), (2, 120))]
    expected = [mlx_lm_tokens(target.model, p, 16) for p in prompts]
    with device_profile.forced("gpu") as gpu:
        assert gpu.prefill_chunk > len(prompts[0])
        for kind in ("paged", "standard"):
            assert engine_tokens(target, prompts[0], 16, kind) == expected[0], f"{kind} cache"
        assert engine_tokens(target, prompts[0], 16, "paged", draft=draft.model) == expected[0], "speculative"
        assert batched_tokens(target, prompts, 16) == expected


def test_the_06b_twin_under_the_gpu_profile_decodes_as_mlx_lm(twin_06b):  # noqa: F811
    """The users' draft's geometry: 4-bit weights, bf16 activations, 151,936 tokens; alone and two batched."""
    loaded = load_model(str(twin_06b))
    prompts = [prompt_of(loaded.model.args.vocab_size, s, 24 + 30 * s) for s in range(2)]
    expected = [mlx_lm_tokens(loaded.model, p, 4) for p in prompts]  # 4-bit products are slow on this CPU
    with device_profile.forced("gpu"):
        assert engine_tokens(loaded, prompts[0], 4, "paged") == expected[0]
        assert batched_tokens(loaded, prompts, 4) == expected


# The twin's bf16 logits differ from mlx-lm's by up to ~1 (of ~17) with either side's rounding, before this
# path too, so its random weights' near ties allow one token; the float32 target's, a run of them.
@pytest.mark.parametrize("which,prefix,chunk,n", [("mini-target", 50, 120, 8), ("twin", 4, 130, 1)])
def test_a_prompt_chunk_over_several_runs_of_blocks_decodes_as_mlx_lm(which, prefix, chunk, n, request, fused_calls):
    """A chunk read after a fork, into slabs of 32 tokens (so the table is several runs): under the GPU's
    branches the runs are joined for the fused kernel (more scores than keys and values to copy), under the
    CPU's they are read in place; greedy tokens equal mlx-lm's either way. The twin: 4-bit, bf16."""
    loaded = load_model("mini-target" if which == "mini-target" else str(request.getfixturevalue("twin_06b")))
    model = loaded.model
    prompt = prompt_of(model.args.vocab_size, 7, prefix + chunk + 1)
    expected = mlx_lm_tokens(model, prompt, n)
    for kind in device_profile.PROFILES:
        with device_profile.forced(kind):
            forward = forward_for(model)
            parent = make_model_cache(model, "paged", pool=make_block_pool(model, block_size=4, slab_blocks=8),
                                      block_size=4)
            prefill(forward, parent, prompt[:prefix], prefix)
            child = parent.fork()
            fused_calls.clear()
            prefill(forward, child, prompt[prefix:-1], chunk)
            mx.eval([layer.state for layer in child.layers])
            assert len(child._gather_index().runs) > 1
            joined = [shape for shape in fused_calls if shape[2] == chunk]
            assert len(joined) == (len(model.model.layers) if kind == "gpu" else 0), kind
            token, got = prompt[-1], []
            for _ in range(n):
                token = int(mx.argmax(forward_rows(forward, child, [token])[-1]).item())
                got.append(token)
        assert got == expected, f"{kind} profile"

"""The batched decode pass against each sequence decoded alone, on both of its attention paths."""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import pytest

from mlxcore.batching.batch_forward import BatchDecoder, forward_rows
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.compiled_forward import CompiledForward
from mlxcore.kv.budget import KVBudget
from mlxcore.kv.geometry import model_geometry
from mlxcore.kv.model_cache import make_block_pool, make_model_cache
from mlxcore.prefill import prefill
from device_profiles import blocked_calls, forward_for, profile  # noqa: F401
from tiny_models import tiny_qwen3

MODEL = tiny_qwen3(seed=21, layers=3, heads=6, kv_heads=2)
FORWARD = CompiledForward(MODEL)
QUANTIZABLE = tiny_qwen3(seed=21, layers=3, heads=6, kv_heads=2, head_dim=32)  # 8-bit groups need 32 or 64
STEPS = 30


def prompts() -> list[list[int]]:
    return [[(s * 131 + i * 7919) % 383 + 1 for i in range(5 + 19 * s)] for s in range(6)]


def budget(path: str, slots: int, kv_bits: int | None = None) -> KVBudget | None:
    """None for the mirror (it takes what it needs); else a KV budget of ``slots`` tokens, room for the
    pool's blocks but not for the mirror's rows (256 tokens a row at least), so each sequence reads its own."""
    model = MODEL if kv_bits is None else QUANTIZABLE
    return None if path == "mirror" else KVBudget(slots * model_geometry(model, kv_bits).token_bytes)


def alone(prompt: list[int], kv_bits: int | None = None) -> list[int]:
    model = MODEL if kv_bits is None else QUANTIZABLE
    forward = forward_for(model)  # traced under the profile in force
    cache = make_model_cache(model, "paged", block_size=4, kv_bits=kv_bits)
    prefill(forward, cache, prompt[:-1], 64)
    token, out = prompt[-1], []
    for _ in range(STEPS):
        token = int(mx.argmax(forward_rows(forward, cache, [token])[-1]).item())
        out.append(token)
    return out


@pytest.mark.parametrize("kv_bits", [None, 8])
@pytest.mark.parametrize("path", ["mirror", "per sequence"])
def test_each_sequence_of_a_batch_decodes_as_it_would_alone(path, kv_bits, profile):  # noqa: F811
    """Six sequences of different lengths, blocks of 4 tokens in slabs of 8 blocks (so tables span slabs
    and interleave), one of them a fork sharing another's prompt; float keys and values, and 8-bit ones
    (the mirror's rows then hold them quantized, as the pool does); under both device profiles (the GPU's
    attends over float rows with MLX's fused kernel, over quantized ones with MLX's softmax)."""
    model = MODEL if kv_bits is None else QUANTIZABLE
    forward = forward_for(model)
    pool = make_block_pool(model, block_size=4, slab_blocks=8, budget=budget(path, 600, kv_bits), kv_bits=kv_bits)
    caches = []
    for p in prompts()[:5]:
        cache = make_model_cache(model, "paged", pool=pool, block_size=4)
        prefill(forward, cache, p[:-1], 64)
        caches.append(cache)
    caches.append(caches[4].fork())  # the sixth shares the fifth's prompt
    decoder, last = BatchDecoder(forward), [p[-1] for p in prompts()[:5]] + [prompts()[4][-1]]
    outs = [[] for _ in caches]
    for _ in range(STEPS):
        logits = decoder(caches, mx.array(last))
        last = mx.argmax(logits, axis=-1).tolist()
        for out, token in zip(outs, last):
            out.append(token)
    expected = [alone(p, kv_bits) for p in prompts()[:5]] + [alone(prompts()[4], kv_bits)]
    assert outs == expected
    for cache, p, out in zip(caches, prompts()[:5] + [prompts()[4]], outs):
        assert cache.offset == len(p + out[:-1]), "each cache holds its prompt and the tokens fed since"
    assert any(len(c._gather_index().runs) > 2 for c in caches), "tables of several runs were read"
    assert (decoder.mirror is not None and decoder.mirror.bytes > 0) == (path == "mirror")


def test_a_pass_is_one_evaluation_on_a_gpu_and_one_a_layer_on_the_cpu(profile, monkeypatch):  # noqa: F811
    """The GPU's pass is one evaluation, as mlx-lm's step is (each evaluation is a launch there); the CPU
    starts each layer while the next one's graph is built. Either way the pool's writes go with the pass:
    nothing the pass wrote is left lazy, and the next pass reads it."""
    forward = forward_for(MODEL)
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=8, budget=None)
    caches = [make_model_cache(MODEL, "paged", pool=pool, block_size=4) for _ in prompts()[:2]]
    for cache, p in zip(caches, prompts()):
        prefill(forward, cache, p[:-1], 64)
    evaluated: list[tuple] = []
    monkeypatch.setattr(mx, "async_eval", lambda *arrays, real=mx.async_eval: evaluated.append(arrays) or real(*arrays))
    decoder, last, outs = BatchDecoder(forward), [p[-1] for p in prompts()[:2]], [[], []]
    for _ in range(STEPS):
        evaluated.clear()
        last = mx.argmax(decoder(caches, mx.array(last)), axis=-1).tolist()
        assert len(evaluated) == (1 if profile.kind == "gpu" else len(MODEL.model.layers))
        writes = [a for arrays in evaluated for a in arrays[1]]
        assert len(writes) >= len(MODEL.model.layers), "every layer's write to the pool is evaluated"
        for out, token in zip(outs, last):
            out.append(token)
    assert outs == [alone(p) for p in prompts()[:2]]


@pytest.mark.parametrize("replies", [1, 2])
@pytest.mark.parametrize("rows", [1, 4])
def test_decoding_replies_in_one_place_each_attend_without_helper_calls(rows, replies, profile, monkeypatch):  # noqa: F811
    """Replies' rows alone in a pass (a lone reply's decode row; verifications of four rows, one reply's or a
    batch's), each reply's tokens in one place of one slab (a run, or runs read as a span), take
    ``run_attention``'s compiled pieces in every layer: no call to the storage's scatter and read or the
    feed's attention (what a reply's token costs in Python), except, under the GPU's profile, verifications
    and replies whose runs are read as a span, which stay on MLX's fused kernel. The logits, and the keys and
    values the pass leaves in the pool, are the general path's."""
    import mlxcore.batching.batch_forward as batch_forward
    from mlxcore.kv.slab_storage import LayerStorage
    forward = forward_for(MODEL)
    sides = []  # this path's caches, then the general path's: a pool each
    for _ in range(2):
        pool = make_block_pool(MODEL, block_size=4, slab_blocks=64, budget=None)
        caches = [make_model_cache(MODEL, "paged", pool=pool, block_size=4) for _ in range(replies)]
        for cache, prompt in zip(caches, prompts()[2:]):
            prefill(forward, cache, prompt[:-1], 64)
        sides.append(caches)
    helpers: list[str] = []
    for owner, name in ((LayerStorage, "scatter"), (LayerStorage, "read"), (PromptFeed, "attend")):
        monkeypatch.setattr(owner, name, lambda *a, real=getattr(owner, name), name=name, **k:
                            helpers.append(name) or real(*a, **k))
    runs = batch_forward._runs

    def step(caches: list, ids: list[list[int]]) -> list[mx.array]:
        feeds = [PromptFeed(forward, cache, mine, decoding=True) for cache, mine in zip(caches, ids)]
        BatchDecoder(forward)([], None, feeds)
        for feed in feeds:
            feed.ran()
        return [forward.logits(feed.h) for feed in feeds]

    for turn in range(6):  # past blocks' ends (two replies' blocks interleave: spans)
        ids = [[(17 * turn + 5 * reply + row) % 383 + 1 for row in range(rows)] for reply in range(replies)]
        helpers.clear()
        fast = step(sides[0], ids)
        # under the GPU's profile one row a reply in one run (its fused kernel cannot take a span's mask shapeless)
        one_run = all(len(cache._gather_index().runs) == 1 for cache in sides[0])
        assert (len(helpers) == 0) == (profile.kind == "cpu" or rows == 1 and one_run)
        monkeypatch.setattr(batch_forward, "_runs", lambda *args: None)  # the general path
        general = step(sides[1], ids)
        monkeypatch.setattr(batch_forward, "_runs", runs)
        assert helpers, "the general path calls the helpers"
        assert all(mx.allclose(a, b, atol=1e-5).item() for a, b in zip(fast, general))
    for ours, theirs in zip(*sides):
        for index in range(len(MODEL.model.layers)):
            for mine, general_kv in zip(ours.tokens(index), theirs.tokens(index)):
                assert mine.shape == general_kv.shape and mx.allclose(mine, general_kv, atol=1e-6).item()


@pytest.mark.parametrize("path", ["mirror", "per sequence"])
@pytest.mark.parametrize("size", [1, 5])
@pytest.mark.parametrize("readers", [1, 2])
def test_prompt_chunks_riding_in_the_decode_passes_attend_over_their_interleaved_blocks(path, size,
                                                                                      readers, profile):  # noqa: F811
    """Prompts read ``size`` tokens a chunk, through every layer, as rows of three decoding sequences' passes
    (``PromptFeed``): in one slab everyone's blocks interleave, and the chunks (and, per sequence, every row)
    read their runs as one view with the gaps masked (``Gather.span``). Everyone's tokens equal each
    sequence's alone; a chunk announced is not found by prefix hits even when its owner tells its ids (no
    layer holds it yet), a read one is. Under both device
    profiles (the GPU's attends with MLX's fused kernel and the chunk's causal mask)."""
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=256, budget=budget(path, 1024 + 256))  # one slab holds all
    caches = []
    for p in prompts()[:3]:
        caches.append(make_model_cache(MODEL, "paged", pool=pool, block_size=4))
        prefill(forward_for(MODEL), caches[-1], p[:-1], 64)
    longs = prompts()[5:3:-1][:readers]
    reading = [make_model_cache(MODEL, "paged", pool=pool, block_size=4) for _ in longs]
    forward = forward_for(MODEL)
    decoder, last = BatchDecoder(forward), [p[-1] for p in prompts()[:3]]
    outs, spanned, feeds = [[] for _ in caches], 0, [None] * readers
    while any(reader.offset < len(long) - 1 for reader, long in zip(reading, longs)):
        for r, (reader, long) in enumerate(zip(reading, longs)):
            fed = reader.offset
            if fed < len(long) - 1:
                feeds[r] = PromptFeed(forward, reader, long[fed:min(fed + size, len(long) - 1)])
                spanned += reader._span_mask(fed + len(feeds[r].ids), len(feeds[r].ids)) is not None
                reader.hash_blocks(long)  # the owner knows every id of its prompt
                assert pool.manager.cached_prefix(long)[0] <= fed, "a chunk announced is not found by prefix hits"
        riding = [feed for feed in feeds if feed is not None]
        last = mx.argmax(decoder(caches, mx.array(last), riding), axis=-1).tolist()
        for out, token in zip(outs, last):
            out.append(token)
        for r, feed in enumerate(feeds):
            if feed is not None:
                feed.ran()
                feeds[r] = None
        for reader, long in zip(reading, longs):
            reader.hash_blocks(long)
    for reader, long in zip(reading, longs):
        assert reader.offset == len(long) - 1 and len(reader._gather_index().runs) > 3
        assert pool.manager.cached_prefix(long)[0] == (len(long) - 1) // 4 * 4, "read, its blocks are hashed"
        token, mine = long[-1], []
        for _ in range(STEPS):  # the reader goes on alone from its prompt
            reader.begin(1)
            token = int(mx.argmax(FORWARD(mx.array([[token]]), cache=reader.layers)[0, -1]).item())
            mine.append(token)
        assert mine == alone(long)
    assert spanned > 5
    assert [out[:STEPS] for out in outs] == [alone(p)[:min(len(outs[0]), STEPS)] for p in prompts()[:3]]


def test_a_long_chunk_beside_decoding_reads_its_prompt_as_prefill_does(profile, blocked_calls):  # noqa: F811
    """200 prompt tokens after 700 read, through every layer in one pass beside two decoding sequences: more
    scores than one of ``cpu_attention``'s key blocks holds, so the CPU attends in key blocks (the GPU with its
    fused kernel). The reader then decodes as the prompt read alone by ``prefill`` does, and so does everyone."""
    blocked = blocked_calls
    pool = make_block_pool(MODEL, block_size=4, slab_blocks=512)
    caches = []
    for p in prompts()[:2]:
        caches.append(make_model_cache(MODEL, "paged", pool=pool, block_size=4))
        prefill(forward_for(MODEL), caches[-1], p[:-1], 64)
    long = [(i * 7919) % 383 + 1 for i in range(901)]
    reader = make_model_cache(MODEL, "paged", pool=pool, block_size=4)
    prefill(forward_for(MODEL), reader, long[:700], 64)
    blocked.clear()
    forward = forward_for(MODEL)
    feed = PromptFeed(forward, reader, long[700:900])
    last = [p[-1] for p in prompts()[:2]]
    first = mx.argmax(BatchDecoder(forward)(caches, mx.array(last), [feed]), axis=-1).tolist()
    feed.ran()
    assert reader.offset == 900
    assert len(blocked) == (MODEL.args.num_hidden_layers if profile.kind == "cpu" else 0), blocked
    assert first == [alone(p)[0] for p in prompts()[:2]]
    token, mine = long[900], []
    for _ in range(STEPS):
        reader.begin(1)
        token = int(mx.argmax(FORWARD(mx.array([[token]]), cache=reader.layers)[0, -1]).item())
        mine.append(token)
    assert mine == alone(long)

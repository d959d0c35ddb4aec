"""A forward pass stopped between layers (Ctrl+C in prefill) leaves layers uneven; caches and the next turn settle.

References: mlx-lm's ``KVCache`` fed the tokens that every layer completed, and a cold run's tokens.
"""

import mlxcore  # noqa: F401
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.kv.errors import CacheStateError
from mlxcore.kv.model_cache import make_model_cache
from mlxcore.params import GenerationParams
from tiny_models import tiny_qwen3

CHUNK = 16
KINDS = [KVConfig(kind="standard"), KVConfig(kind="paged", block_size=8), KVConfig(kind="rotating", max_kv=256)]


class InterruptOnCall(nn.Module):
    """Wraps a layer's key projection (it runs before that layer's cache update); call ``fail_at`` raises
    KeyboardInterrupt, as Ctrl+C does part way through a forward pass."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls, self.fail_at = 0, None

    def __call__(self, x: mx.array) -> mx.array:
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt
        return self.inner(x)


def interruptible(seed: int) -> tuple[nn.Module, InterruptOnCall]:
    """A 3-layer tiny Qwen3 whose middle layer can be made to stop a forward pass."""
    model = tiny_qwen3(seed=seed, layers=3, vocab_size=512)
    attn = model.model.layers[1].self_attn
    attn.k_proj = InterruptOnCall(attn.k_proj)
    return model, attn.k_proj


def prompt_of(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 512, length).tolist()


@pytest.mark.parametrize("kv", KINDS, ids=lambda kv: kv.kind)
def test_state_dict_after_a_pass_stopped_between_layers_equals_mlx_lm(kv):
    model, stopper = interruptible(seed=1)
    ids = prompt_of(1, 2 * CHUNK)
    cache = make_model_cache(model, kv.kind, block_size=kv.block_size, max_kv=kv.max_kv)
    stopper.fail_at = 2  # layer 0 stores the second chunk, layers 1-2 do not
    for piece in (ids[:CHUNK], ids[CHUNK:]):
        cache.begin(len(piece))
        try:
            mx.eval(model.model(mx.array([piece]), cache=cache.layers))
        except KeyboardInterrupt:
            pass
    reference = make_prompt_cache(model)
    mx.eval(model.model(mx.array([ids[:CHUNK]]), cache=reference))

    tensors, meta = cache.state_dict(ids)  # the pass stopped: it holds the first chunk
    assert meta["tokens"] == ids[:CHUNK]
    for i, layer in enumerate(reference):
        for name, expected in (("keys", layer.keys), ("values", layer.values)):
            got = tensors[f"{i}.{name}"]
            if kv.kind != "rotating":  # rotating saves its stale slots too, with the offset that masks them
                assert got.shape[2] == CHUNK, f"layer {i} {name}: {got.shape[2]} positions, {CHUNK} expected"
            same = mx.allclose(got[..., :CHUNK, :], expected[..., :CHUNK, :], atol=1e-5).item()
            assert same, f"layer {i} {name} differs from mlx-lm's KVCache"


def run(engine, caches, prompt, n=12):
    events = engine.generate(prompt, caches, GenerationParams(max_tokens=n, prefill_chunk=CHUNK))
    return [e.token for e in events if isinstance(e, TokenEvent)]


@pytest.mark.parametrize("kv", KINDS, ids=lambda kv: kv.kind)
def test_next_turn_after_an_interrupted_prefill_equals_a_cold_run(kv):
    """Before: the standard cache kept layer 0's extra chunk in its token list, so the retry prefilled
    from the wrong position and answered differently."""
    model, stopper = interruptible(seed=2)
    engine = Engine(model, None, kv=kv)
    prompt = prompt_of(2, 3 * CHUNK + 5)
    caches = engine.new_caches()
    stopper.fail_at = stopper.calls + 2  # in the second prefill chunk, between layers 0 and 1
    with pytest.raises(KeyboardInterrupt):
        run(engine, caches, prompt)
    stopper.fail_at = None
    again = run(engine, caches, prompt)
    assert engine.last_stats.reused_tokens == CHUNK  # the first chunk, which every layer holds
    cold = Engine(model, None, kv=kv)
    assert again == run(cold, cold.new_caches(), prompt)
    assert caches.tokens == prompt + again


def test_reuse_refuses_a_cache_that_did_not_rewind():
    """A layer whose trim reports success but removes nothing: the engine raises, never prefills from there."""
    engine = Engine(tiny_qwen3(seed=3, vocab_size=512), None, kv=KVConfig(kind="standard"))
    caches = engine.new_caches()
    prompt = prompt_of(3, 20)
    reply = run(engine, caches, prompt)
    for layer in caches.target.layers:
        layer.trim = lambda n: n  # says it removed n tokens; the offset stays
    with pytest.raises(CacheStateError, match="holds 32 tokens after keeping 20"):
        run(engine, caches, prompt + [reply[0] ^ 1])


def test_verify_pass_stopped_between_layers_on_a_wrapped_window_settles():
    """Rounds of 20 drafts on a 24-token window: a stop inside the target's verify pass leaves layer 0 all 21
    tokens ahead. Settling rewinds just those (before: it rewound 20 more, past what the window holds)."""
    from bench.draft_lengths import FixedDraftLength

    model, stopper = interruptible(seed=4)
    kv = KVConfig(kind="rotating", max_kv=24)
    engine = Engine(model, None, kv=kv, draft_model=tiny_qwen3(seed=5, vocab_size=512, layers=1), num_draft=20)
    engine.draft_control = FixedDraftLength(20)
    prompt, caches, emitted = prompt_of(4, 40), engine.new_caches(), []
    stopper.fail_at = stopper.calls + 3 + 3  # three prefill chunks, then the third verify pass
    with pytest.raises(KeyboardInterrupt):
        for event in engine.generate(prompt, caches, GenerationParams(max_tokens=30, prefill_chunk=CHUNK)):
            emitted += [event.token] if isinstance(event, TokenEvent) else []
    stopper.fail_at = None
    assert emitted and caches.target.offset == caches.draft.offset == len(prompt) + len(emitted)
    follow = prompt + emitted + prompt_of(5, 3)
    cold = Engine(model, None, kv=kv)
    assert run(engine, caches, follow) == run(cold, cold.new_caches(), follow)

"""Prefix caching for hybrid models (``mlxcore/kv/hybrid_prefixes.py``): a prompt that starts as an ended
request's did reads only the rest, and answers as it would read from nothing.

As ``serve``'s clients do, each request comes without caches: a conversation sent again with one more message
starts where the previous request's cache ended; a prompt that leaves it part way starts from the snapshot
within their common prefix. References: mlx-lm's ``stream_generate`` on the whole prompt; and, over HTTP, the
same request answered cold.
"""

from __future__ import annotations

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.nn as nn
import pytest

from mlxcore import GenerationParams, TokenEvent
from mlxcore.batching.local import LocalBatch
from mlxcore.batching.request import Request
from mlxcore.chat_template import render_chat
from test_batching_runner import Collector
from test_hybrid_batch import engine_of, folder, mlx_lm_tokens  # noqa: F401  (the tiny Qwen3.5 and Qwen3-Next)

GREEDY = GenerationParams(temperature=0.0, max_tokens=10)


def answer(engine, prompt: list[int], *, max_running: int = 4) -> tuple[list[int], int]:
    """(tokens, prompt tokens reused) of one request, on the scheduler as ``serve`` runs it."""
    batch = Collector(LocalBatch(engine, max_running=max_running))
    handle = batch.submit(Request(tuple(prompt), GREEDY))[0]
    batch.run()
    return batch.tokens(handle), batch.final(handle).stats.reused_tokens


def test_a_conversation_sent_again_reads_only_what_is_new(folder):  # noqa: F811
    engine = engine_of(folder)
    first = list(range(100, 140))
    reply, reused = answer(engine, first)
    assert reused == 0
    second = first + reply + [7, 8, 9]
    tokens, reused = answer(engine, second)
    assert reused == len(first + reply), "the whole of the first request's cache was a start of this prompt"
    assert tokens == mlx_lm_tokens(folder, [second], [10])[0]


def test_a_prompt_that_leaves_a_kept_cache_starts_from_its_snapshot(folder):  # noqa: F811
    """A history that drops the last reply (its thinking, say) leaves the kept cache at the first prompt's end:
    the snapshot there (before its last token, which the first decode step fed) is where it starts."""
    engine = engine_of(folder)
    first = list(range(300, 345))
    answer(engine, first)
    second = first + [11, 12, 13, 14]
    tokens, reused = answer(engine, second)
    assert reused == len(first) - 1
    assert tokens == mlx_lm_tokens(folder, [second], [10])[0]
    unrelated = list(range(900, 920))
    assert answer(engine, unrelated) == (mlx_lm_tokens(folder, [unrelated], [10])[0], 0)


def test_a_history_rendered_without_the_empty_think_block_starts_at_that_turns_header(folder):  # noqa: F811
    """Thinking off, the template gives the reply an empty think block to start from, and drops it from the
    history of the next request: the two agree up to that turn's header, where the prompt's reading left a
    snapshot. The second request starts there, and answers as mlx-lm does."""
    engine = engine_of(folder)
    tokenizer = engine.tokenizer
    turn_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    first = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 12 + 7?"}]
    prompt = render_chat(tokenizer, first, enable_thinking=False)
    answer(engine, prompt)
    history = first + [{"role": "assistant", "content": "19"}, {"role": "user", "content": "And 3 + 4?"}]
    second = render_chat(tokenizer, history, enable_thinking=False)
    header = max(at for at, token in enumerate(prompt) if token == turn_start)
    agree = next(at for at, (a, b) in enumerate(zip(prompt, second)) if a != b)
    assert header < agree < len(prompt) - 1, "the histories part inside the header's think block"
    tokens, reused = answer(engine, second)
    assert reused == header
    assert tokens == mlx_lm_tokens(folder, [second], [10])[0]


def test_requests_side_by_side_sharing_a_start_each_answer_as_alone(folder):  # noqa: F811
    """Three requests at once, each a different question after the same long start that an ended request
    read: each starts from that cache (a fork of it: their writes never meet) and is mlx-lm's reply."""
    engine = engine_of(folder)
    system = list(range(500, 560))
    answer(engine, system + [1, 2])
    prompts = [system + [1, 2, 3 + s, 4] for s in range(3)]
    batch = Collector(LocalBatch(engine, max_running=4))
    handles = [batch.submit(Request(tuple(p), GREEDY))[0] for p in prompts]
    batch.run()
    assert batch.batch.runner.tally.largest_batch == 3
    assert [batch.final(h).stats.reused_tokens for h in handles] == [len(system) + 1] * 3
    assert [batch.tokens(h) for h in handles] == mlx_lm_tokens(folder, prompts, [10] * 3)


def test_the_store_keeps_within_its_limit_least_recently_used_first(folder):  # noqa: F811
    engine = engine_of(folder)
    prompts = [list(range(100 * s, 100 * s + 30)) for s in range(1, 4)]
    for p in prompts:
        answer(engine, p)
    store = engine.prefixes
    sizes = [size for _, _, size in store.entries]
    assert len(sizes) == 3 and store.bytes == sum(sizes)
    store.clear()
    store.limit = sizes[0] + sizes[1] + sizes[2] // 2
    for p in prompts:
        answer(engine, p)  # each kept as it ends: the third pushes out the first
    assert [tokens[:30] for tokens, _, _ in store.entries] == [tuple(prompts[1]), tuple(prompts[2])]
    assert store.bytes <= store.limit
    assert answer(engine, prompts[1] + [5])[1] > 0  # a hit makes it the most recently used
    assert [tokens[:30] for tokens, _, _ in store.entries][-1] == tuple(prompts[1])


def test_a_pass_stopped_between_layers_leaves_a_cache_that_goes_on_right(folder):  # noqa: F811
    """Ctrl+C while a prompt is read, in the last linear layer: the layers before it went ahead and cannot be
    rewound. The interrupt reaches the caller (not a cache error), the cache goes back to its snapshot, every
    layer alike; the chat's next turn on it, and a request that starts from it once kept, answer as mlx-lm."""
    engine = engine_of(folder)

    class Stop(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def __call__(self, *args, **kwargs):
            raise KeyboardInterrupt

    first = list(range(100, 130))
    caches = engine.new_caches()
    list(engine.generate(first, caches, GREEDY.replaced({"max_tokens": 3})))
    layers = engine.model.layers
    index = max(i for i, layer in enumerate(layers) if hasattr(layer, "linear_attn"))
    original = layers[index].linear_attn
    layers[index].linear_attn = Stop(original)
    try:
        with pytest.raises(KeyboardInterrupt):
            list(engine.generate(first + [5, 6, 7, 8], caches, GREEDY))
    finally:
        layers[index].linear_attn = original
    cache = caches.target
    assert cache.offset == len(first) - 1 and caches.tokens == first[:-1], "back at the snapshot"
    assert all(state.offset == cache.offset for state in cache.states)
    second = first + [5, 6, 7, 8]
    expected = mlx_lm_tokens(folder, [second], [10])[0]
    assert [e.token for e in engine.generate(second, caches, GREEDY) if isinstance(e, TokenEvent)] == expected
    caches.release()  # kept whole under the ids it holds
    third = second + expected + [9]
    assert answer(engine, third) == (mlx_lm_tokens(folder, [third], [10])[0], len(second + expected))


def test_serve_answers_a_conversation_sent_again_from_its_kept_cache(tmp_path):
    """A real ``mlxchat serve``, the official openai client: a second turn sent with the first's history
    reports cached prompt tokens and answers as the same request sent cold, before any other."""
    from serve_process import ServeProcess
    from test_hybrid import FAMILIES
    from tiny_models import write_model_folder
    from assets import MODELS_DIR

    model, config = FAMILIES["qwen3_5"]
    hybrid = write_model_folder(model(), tmp_path / "tiny-hybrid", MODELS_DIR / "mini-target", config=config())
    first = [{"role": "user", "content": "What is 12 + 7?"}]
    options = dict(model="tiny-hybrid", temperature=0, max_tokens=12,
                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    with ServeProcess(tmp_path, pair=("--model", str(hybrid))) as server:
        client = server.client()
        reply = client.chat.completions.create(messages=first, **options).choices[0].message.content
        second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And 3 + 4?"}]
        warm = client.chat.completions.create(messages=second, **options)
    with ServeProcess(tmp_path, pair=("--model", str(hybrid))) as server:
        cold = server.client().chat.completions.create(messages=second, **options)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens > 10
    assert warm.choices[0].message.content == cold.choices[0].message.content

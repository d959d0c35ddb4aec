"""The block drafter (``mlxcore/block_drafter.py``, ``batching/drafters.py``): folders in DFlash's published layout
(random weights, built by ``bench/twin_block.py``) load, draft and verify; greedy replies equal plain greedy, alone
and in a batch, on the embedded target and the 0.6B twin and under a JSON schema; sampled tokens follow the
target's distribution; the drafter's context is the target's hidden states at the layers it names; a folder
that does not fit its target is refused in one line.

Token equality holds on MLX's CPU backend (docs/internals.md, "What is exact on which device").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer
from scipy.stats import chisquare
from structured_schemas import SCHEMAS
from tiny_models import tiny_config, tiny_qwen3
from twin_fixtures import twin_06b_f32, twin_8b_f32, twins_root  # noqa: F401

from app.tui.widgets.status_line import stats_text
from assets import QWEN3_TOKENIZER_DIR
from bench.batch_load import stream_prompt
from bench.draft_lengths import FixedDraftLength
from bench.side_by_side import side_by_side
from bench.twin_block import write_block_drafter
from mlxcore import grammar
from mlxcore.batching.local import LocalBatch, drain
from mlxcore.batching.request import Request
from mlxcore.block_drafter import BlockContext, load_block_drafter
from mlxcore.engine import Engine, KVConfig
from mlxcore.errors import ModelLoadError
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams, SamplingParams
from mlxcore.sampling import distribution

ROOT = Path(__file__).resolve().parent.parent
TARGET = load_model("mini-target")
GREEDY = GenerationParams(max_tokens=24)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A two-layer drafter for the embedded target, in z-lab's layout."""
    return write_block_drafter(tmp_path_factory.mktemp("block") / "mini-block", TARGET.path, layers=2)


def engine(model, tokenizer, drafter=None, k: int | None = 4, kv: KVConfig = KVConfig(kind="paged", block_size=8)):
    made = Engine(model, tokenizer, kv=kv, block_drafter=drafter)
    made.eos_ids = set()  # replies run to max_tokens: across steps and blocks
    if drafter is not None and k is not None:
        made.draft_control = FixedDraftLength(k)  # a round every step
    return made


def reply(made: Engine, prompt: list[int], params: GenerationParams, **options):
    caches = made.new_caches()
    events = list(made.generate(prompt, caches, params, **options))
    assert isinstance(events[-1], FinalEvent)
    return [e.token for e in events if isinstance(e, TokenEvent)], events[-1], caches


def test_a_folder_in_z_labs_layout_loads_with_its_fields(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 16
    assert config["dflash_config"]["target_layer_ids"] == [1, 3]
    drafter = load_block_drafter(folder, TARGET.model)
    assert drafter.config.target_layer_ids == (1, 3) and drafter.config.mask_token_id == 2047
    names = set(mx.load(str(folder / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_norm.weight",
            "layers.0.mlp.down_proj.weight"} <= names and not any("embed" in n or "lm_head" in n for n in names)


@pytest.mark.parametrize("kv", [KVConfig(kind="paged", block_size=8), KVConfig(kind="standard"),
                                KVConfig(kind="rotating", max_kv=48)], ids=lambda kv: kv.kind)
@pytest.mark.parametrize("k", [1, 4, None], ids=["k1", "k4", "adaptive"])
def test_greedy_with_the_block_drafter_equals_plain(folder, kv, k):
    drafted = engine(TARGET.model, TARGET.tokenizer, load_block_drafter(folder, TARGET.model), k, kv)
    plain = engine(TARGET.model, TARGET.tokenizer, kv=kv)
    for seed in range(2 if k == 4 else 1):  # (k = 4: two prompt lengths)
        prompt = stream_prompt(2048, seed, 12 + 9 * seed)
        tokens, final, _ = reply(drafted, prompt, GREEDY)
        assert tokens == reply(plain, prompt, GREEDY)[0]
        if k is not None:
            assert final.stats.drafter == "block" and final.stats.draft_proposed >= k * 3, final.stats


def test_its_context_holds_the_targets_hidden_states_at_the_layers_it_names(folder):
    """After a reply that drafted every step, the drafter's context keys and values equal those made at once
    from mlx-lm's own forward over the reply's tokens (each named layer's output), at every position."""
    drafter = load_block_drafter(folder, TARGET.model)
    made = engine(TARGET.model, TARGET.tokenizer, drafter, 3)
    _, _, caches = reply(made, stream_prompt(2048, 3, 21), GenerationParams(max_tokens=30))
    context = caches.context
    # Every token but the last, which the reply's end feeds to the target alone (the caches then hold its ids)
    assert context is not None and context.end == caches.target.offset - 1, (context.runs, caches.target.offset)
    assert all(a + n == b for (a, n), (b, _) in zip(context.runs, context.runs[1:])), "no gaps"
    assert_context_is_the_targets(drafter, context, caches.ids)


def assert_context_is_the_targets(drafter, context, ids: list[int]) -> None:
    """Each run of ``context`` holds, at its positions, the keys and values the drafter makes of mlx-lm's own
    forward over ``ids`` (the outputs of the layers it names)."""
    h = TARGET.model.model.embed_tokens(mx.array([ids[:context.end]]))
    outputs = []
    for layer in TARGET.model.model.layers:
        h = layer(h, "causal", None)
        outputs.append(h[0])
    features = mx.concatenate([outputs[i] for i in drafter.config.target_layer_ids], axis=-1)
    expected = [(k.swapaxes(0, 2), v.swapaxes(0, 2)) for k, v in drafter.context(features, mx.arange(context.end))]
    row = 0
    for start, count in context.runs:
        for (keys, values), (want_k, want_v) in zip(context.layers, expected):
            np.testing.assert_allclose(keys[:, :, row:row + count], want_k[:, :, start:start + count], atol=2e-4)
            np.testing.assert_allclose(values[:, :, row:row + count], want_v[:, :, start:start + count], atol=2e-4)
        row += count


def test_the_context_writes_after_its_rows_and_a_rewind_only_moves_its_length():
    """Rows appended one step at a time across the buffer's growths, a rewind and a gap hold what a list of
    the rows holds; a round's block joins them with or without room after them; a fork keeps its rows while
    the original writes over the ones it dropped, and the other way round; the capacity doubles as it grows (a reply's steps copy what is held a few times, not each
    step)."""
    rng = np.random.default_rng(0)

    def rows(n: int) -> list[tuple[mx.array, mx.array]]:
        return [(mx.array(rng.standard_normal((1, 2, n, 4)).astype(np.float32)),
                 mx.array(rng.standard_normal((1, 2, n, 4)).astype(np.float32))) for _ in range(2)]

    def held(context: BlockContext) -> list[np.ndarray]:
        return [np.asarray(part) for both in context.layers for part in both]

    def joined(*parts: list[tuple[mx.array, mx.array]]) -> list[np.ndarray]:
        return [np.concatenate([np.asarray(p[layer][i]) for p in parts], axis=2) for layer in range(2) for i in (0, 1)]

    context, written, capacities = BlockContext(), [rows(10)], set()
    context.append(0, written[0])
    for position in range(10, 600):
        written.append(rows(1))
        context.append(position, written[-1])
        capacities.add(context.capacity)
    assert capacities == {256, 512, 1024}, capacities
    np.testing.assert_array_equal(np.concatenate(held(context)), np.concatenate(joined(*written)))
    block, full = rows(5), BlockContext()
    full.append(0, rows(256))  # no room after its rows: the block is joined to a copy
    for c in (context, full):  # a round's block, written past the rows held where there is room
        want = [np.concatenate([h, np.asarray(b)], axis=2) for h, b in zip(held(c)[2:], block[1])]
        before = held(c)
        assert [np.asarray(a).tolist() for a in c.joined(1, *block[1])] == [w.tolist() for w in want]
        assert [h.tolist() for h in held(c)] == [h.tolist() for h in before]  # the rows held are unchanged
    context.trim(200)  # a rewind: 200 rows left (the first 10 and 190 single ones)
    fork = context.fork()
    again, gap = rows(5), rows(3)
    context.append(200, again)
    context.append(300, gap)  # positions 205..299 were never read by the drafter
    assert context.runs[-2:] == [(200, 5), (300, 3)] and context.end == 303 and context.length == 208
    for got, want in zip(held(context), joined(*written[:191], again, gap)):
        np.testing.assert_array_equal(got, want)
    fork.append(200, rows(2))
    for got, want in zip(held(context), joined(*written[:191], again, gap)):
        np.testing.assert_array_equal(got, want)
    assert fork.end == 202 and held(fork)[0][:, :, :200].tolist() == joined(*written[:191])[0].tolist()
    context.trim(0)  # emptied: its buffers go (their bytes back to the KV budget, where there is one)
    assert context.layers == [] and context.end == 0 and context.capacity == 0 and context.bytes == 0


class EveryOtherStep(FixedDraftLength):
    """k on every other step, a plain step between (as an adaptive controller's plain steps come)."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.steps = 0

    def choose(self) -> int:
        self.steps += 1
        return self.k if self.steps % 2 else 0


def test_in_a_batch_plain_steps_feed_each_context_too(folder):
    """Three replies side by side, drafting every other step: after every step each reply's context holds
    every position its target read, from 0, no gap (the plain rows of the batch's pass kept their hidden
    states too), and at the end the keys and values made from mlx-lm's forward; greedy equals plain."""
    drafter = load_block_drafter(folder, TARGET.model)
    made = engine(TARGET.model, TARGET.tokenizer, drafter, None)
    made.draft_control = EveryOtherStep(3)
    batch = LocalBatch(made)
    prompts = [stream_prompt(2048, 10 + s, 9 + 6 * s) for s in range(3)]
    handles = [batch.submit(Request(tuple(p), GREEDY, keep_caches=True))[0] for p in prompts]
    events: dict[str, list] = {h.request_id: [] for h in handles}
    plain_steps = 0
    while batch.busy:
        batch.step()
        running = [getattr(batch.runner.sequences.get(h.request_id), "caches", None) for h in handles]
        plain_steps += made.draft_control.steps % 2 == 0 and len([c for c in running if c is not None]) > 1
        for caches in running:
            if caches is not None and caches.context is not None:
                runs = caches.context.runs
                assert runs[0][0] == 0 and caches.context.end == caches.target.offset, (runs, caches.target.offset)
                assert all(a + n == b for (a, n), (b, _) in zip(runs, runs[1:])), f"a gap: {runs}"
        for h in handles:
            events[h.request_id].extend(drain(h))
    assert batch.runner.tally.largest_batch == 3 and plain_steps >= 6
    plain = engine(TARGET.model, TARGET.tokenizer)
    for prompt, h in zip(prompts, handles):
        got = events[h.request_id]
        assert [e.token for e in got if isinstance(e, TokenEvent)] == reply(plain, prompt, GREEDY)[0]
        assert got[-1].stats.draft_proposed > 0
        assert h.caches is not None and h.caches.context is not None
        assert_context_is_the_targets(drafter, h.caches.context, h.caches.ids)


def test_a_chats_next_turn_on_the_same_caches_equals_plain(folder):
    """Turn 2 keeps turn 1's caches up to their common prefix (its context trimmed with the target's): its
    tokens are plain greedy's, and the drafter read turn 1's tokens (its context did not start again)."""
    drafted = engine(TARGET.model, TARGET.tokenizer, load_block_drafter(folder, TARGET.model), 3)
    plain = engine(TARGET.model, TARGET.tokenizer)
    first = stream_prompt(2048, 5, 15)
    caches = drafted.new_caches()
    reply_1 = [e.token for e in drafted.generate(first, caches, GREEDY) if isinstance(e, TokenEvent)]
    second = first + reply_1[:-3] + stream_prompt(2048, 6, 7)  # an edited history: the last 3 tokens differ
    got = [e.token for e in drafted.generate(second, caches, GREEDY) if isinstance(e, TokenEvent)]
    assert got == reply(plain, second, GREEDY)[0]
    assert caches.context is not None and caches.context.runs[0] == (0, 14), caches.context.runs[:3]


def test_a_turn_that_does_not_draft_leaves_no_rows_of_tokens_it_dropped(folder):
    """Turn 2 keeps turn 1's caches up to their common prefix and reads on without drafting (its rows keep no
    hidden states): the context keeps no row past that prefix (they were turn 1's tokens, which turn 2
    changed), so turn 3, drafting, reads the target's hidden states of its own tokens only."""
    drafter = load_block_drafter(folder, TARGET.model)
    drafted = engine(TARGET.model, TARGET.tokenizer, drafter, 3)
    first = stream_prompt(2048, 7, 15)
    caches = drafted.new_caches()
    reply_1 = [e.token for e in drafted.generate(first, caches, GREEDY) if isinstance(e, TokenEvent)]
    assert caches.context is not None and caches.context.end > len(first) + 10
    second = first + reply_1[:5] + stream_prompt(2048, 8, 6)  # turn 1's reply cut after 5 tokens
    list(drafted.generate(second, caches, GREEDY, use_draft=False))
    assert caches.context.end <= len(first) + 5, caches.context.runs
    third = caches.tokens + stream_prompt(2048, 9, 4)
    got = [e.token for e in drafted.generate(third, caches, GREEDY) if isinstance(e, TokenEvent)]
    assert got == reply(engine(TARGET.model, TARGET.tokenizer), third, GREEDY)[0]
    assert_context_is_the_targets(drafter, caches.context, caches.ids)


def test_a_prefix_reused_from_the_pool_starts_the_context_there(folder):
    """A reply whose prompt's first blocks are found in the pool (another reply's) reads only the rest: its
    context starts at the first position it read, at the right positions (the keys and values of mlx-lm's
    forward there), and its tokens are plain greedy's."""
    drafter = load_block_drafter(folder, TARGET.model)
    made = engine(TARGET.model, TARGET.tokenizer, drafter, 3)
    shared = stream_prompt(2048, 11, 16)  # two blocks of 8
    reply(made, shared + stream_prompt(2048, 12, 5), GREEDY)
    prompt = shared + stream_prompt(2048, 13, 7)
    tokens, final, caches = reply(made, prompt, GREEDY)
    assert caches.context is not None and caches.context.runs[0][0] == 16, caches.context.runs[:2]
    assert_context_is_the_targets(drafter, caches.context, caches.ids)
    assert tokens == reply(engine(TARGET.model, TARGET.tokenizer), prompt, GREEDY)[0]
    assert final.stats.draft_proposed > 0


def test_the_contexts_bytes_come_from_the_kv_budget_and_a_full_budget_means_plain(folder):
    """The context's buffers take their bytes from the engine's KV budget beside the pool's slabs, and give them
    back when the conversation's caches are released; with a budget that holds the reply's KV but not a
    context buffer, the reply decodes without the drafter (plain greedy's tokens, no error), and the budget
    is never exceeded."""
    drafter = load_block_drafter(folder, TARGET.model)
    prompt = stream_prompt(2048, 14, 30)
    plain = reply(engine(TARGET.model, TARGET.tokenizer), prompt, GREEDY)[0]
    roomy = engine(TARGET.model, TARGET.tokenizer, drafter, 3, KVConfig(kind="paged", block_size=8,
                                                                       max_kv_bytes=2_000_000))
    tokens, final, caches = reply(roomy, prompt, GREEDY)
    context, budget = caches.context, roomy.kv_budget
    assert context is not None and context.bytes == context.capacity * 1024  # 2 layers x 2 x 2 heads x 32 x 4 B
    slabs = sum(pool.slab_bytes(i) for pool in roomy.pools.values() for i in range(pool.slabs))
    assert budget.in_use == slabs + context.bytes and final.stats.draft_proposed > 0 and tokens == plain
    caches.release()
    assert budget.in_use == slabs and context.bytes == 0
    tight = engine(TARGET.model, TARGET.tokenizer, drafter, 3, KVConfig(kind="paged", block_size=8,
                                                                       max_kv_bytes=300_000))
    tokens, final, caches = reply(tight, prompt, GREEDY)
    assert caches.context is not None and caches.context.refused and caches.context.bytes == 0
    assert tokens == plain and final.stats.draft_proposed == 0 and final.finish_reason == "length"
    assert tight.kv_budget.peak <= 300_000, tight.kv_budget.peak
    # With prompt lookup beside it (``LookupFirst``, the default), the reply whose context was refused still
    # drafts with lookup: its own text repeats (the prompt's tokens twice over).
    looks = Engine(TARGET.model, TARGET.tokenizer, kv=KVConfig(kind="paged", block_size=8, max_kv_bytes=300_000),
                   block_drafter=drafter, prompt_lookup=True)
    looks.eos_ids, looks.draft_control = set(), FixedDraftLength(3)
    twice = prompt + prompt
    tokens, final, caches = reply(looks, twice, GREEDY)
    assert caches.context is not None and caches.context.refused
    assert tokens == reply(engine(TARGET.model, TARGET.tokenizer), twice, GREEDY)[0]
    assert final.stats.draft_proposed > 0 and final.stats.drafter == "block+lookup", final.stats


def test_replies_drafting_side_by_side_equal_each_alone(folder):
    made = engine(TARGET.model, TARGET.tokenizer, load_block_drafter(folder, TARGET.model), 3)
    prompts = [stream_prompt(2048, s, 9 + 17 * s) for s in range(4)]
    batch, replies = side_by_side(made, prompts, GREEDY)
    assert batch.runner.tally.largest_batch == 4
    plain = engine(TARGET.model, TARGET.tokenizer)
    for prompt, got in zip(prompts, replies):
        assert [e.token for e in got if isinstance(e, TokenEvent)] == reply(plain, prompt, GREEDY)[0]
        assert got[-1].stats.draft_proposed > 0, "each drafted beside the others"


@pytest.mark.parametrize("which, layers", [("twin_06b_f32", (1, 25)), ("twin_8b_f32", (1, 33))],
                         ids=["0.6b", "8b"])
def test_greedy_on_the_twins_equals_plain(which, layers, tmp_path, request):
    twin = load_model(str(request.getfixturevalue(which)))
    drafter = load_block_drafter(write_block_drafter(tmp_path / "twin-block", twin.path, layers=2), twin.model)
    assert drafter.config.target_layer_ids == layers
    prompt, params = stream_prompt(twin.model.args.vocab_size, 1, 20), GenerationParams(max_tokens=10)
    tokens, final, _ = reply(engine(twin.model, twin.tokenizer, drafter, 4), prompt, params)
    assert tokens == reply(engine(twin.model, twin.tokenizer), prompt, params)[0]
    assert final.stats.draft_proposed > 0


def test_constrained_replies_with_the_block_drafter_equal_each_without(tmp_path):
    """Under a JSON schema the drafter proposes under the grammar's masks (its tokens sampled from its own
    distribution, masked): the text equals the reply without a drafter."""
    tokenizer = load_tokenizer(QWEN3_TOKENIZER_DIR)
    vocab = 151_936
    target = tiny_qwen3(0, vocab_size=vocab)
    drafter = load_block_drafter(write_block_drafter(tmp_path / "b", tiny_config(vocab_size=vocab)), target)
    prompt = list(tokenizer.encode("<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n"
                                   "<think>\n\n</think>\n\n", add_special_tokens=False))
    params = GenerationParams(max_tokens=120)
    drafted, plain = (Engine(target, tokenizer, kv=KVConfig(kind="paged"), block_drafter=d) for d in (drafter, None))
    drafted.draft_control = FixedDraftLength(4)
    for name in ("nested",):
        schema = grammar.json_schema(SCHEMAS[name])
        final = reply(drafted, prompt, params, grammar=schema)[1]
        assert final.text == reply(plain, prompt, params, grammar=schema)[1].text
        assert final.stats.draft_proposed > 0


def test_sampled_tokens_after_a_block_draft_follow_the_target_distribution(tmp_path):
    """1,000 seeded one-token replies, four at a time, each the verdict of a round (k = 3) of a drafter that
    mostly disagrees (q its own distribution): the counts against the target's distribution, chi-square
    p > 0.001."""
    target = tiny_qwen3(seed=3, vocab_size=512)
    drafter = load_block_drafter(write_block_drafter(tmp_path / "b", tiny_config(vocab_size=512)), target)
    made = engine(target, None, drafter, 3)
    prompt = np.random.default_rng(6).integers(0, 512, 8).tolist()
    p = np.array(distribution(target(mx.array([prompt]))[0, -1], SamplingParams(temperature=0.8)), dtype=np.float64)
    p /= p.sum()
    counts = np.zeros_like(p)
    for seeds in range(0, 1000, 4):
        batch = LocalBatch(made)
        handles = [batch.submit(Request(tuple(prompt), GenerationParams(max_tokens=1, temperature=0.8, seed=s)))[0]
                   for s in range(seeds, seeds + 4)]
        batch.run_until(lambda handles=handles: all(h.finished.is_set() for h in handles))
        assert batch.runner.tally.largest_batch == 4
        for handle in handles:
            events = list(drain(handle))
            assert events[-1].stats.draft_proposed == 3, "every first token came out of a round in the batch"
            counts[next(e.token for e in events if isinstance(e, TokenEvent))] += 1
    big = p * counts.sum() >= 5  # chi-square needs expected counts of 5 or more: pool the rest
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(p[big], p[~big].sum()) * counts.sum()
    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected)


@pytest.mark.parametrize("options, said", [
    (dict(target_layer_ids=[2, 9]), "reads target layers [9], and this target has 6 layers"),
    (dict(mask_token_id=5000), "mask token 5000"),
], ids=["layers", "mask"])
def test_a_folder_that_does_not_fit_its_target_is_refused_in_one_line(tmp_path, options, said):
    folder = write_block_drafter(tmp_path / "bad", TARGET.path, **options)
    with pytest.raises(ModelLoadError, match=said.replace("[", r"\[").replace("]", r"\]")):
        load_block_drafter(folder, TARGET.model)


def ask(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "ask", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_a_drafter_of_another_vocabulary_is_refused(tmp_path):
    other_vocab = write_block_drafter(tmp_path / "vocab", {**json.loads((TARGET.path / "config.json").read_text()),
                                                           "vocab_size": 4096})
    with pytest.raises(ModelLoadError, match="4,096 tokens, and this target's has 2,048"):
        load_block_drafter(other_vocab, TARGET.model)


def test_ask_refuses_a_drafter_made_for_another_model_in_one_line(tmp_path):
    """A drafter of another hidden size (the twins' 64): `mlxchat ask --draft FOLDER` says so in one line,
    no traceback."""
    wide = write_block_drafter(tmp_path / "wide", tiny_config(vocab_size=2048, hidden=64, layers=6))
    done = ask("--draft", str(wide), "--max-tokens", "4", "Hi")
    assert done.returncode != 0 and "hidden size 64, and this target's is 192" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_ask_with_a_block_drafter_names_it_and_the_status_line_shows_its_acceptance(folder):
    done = ask("--json", "--draft", str(folder), "--max-tokens", "30", "--no-think", "What is 12 times 9?")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout.strip().splitlines()[-1])["stats"]
    assert stats["drafter"] == "block+lookup" and stats["draft_proposed"] > 0, stats  # lookup beside it: the default
    assert "block+lookup 25%" in stats_text({**stats, "acceptance": 0.25})


def test_an_embedded_drafter_is_no_model_to_chat_with(tmp_path, monkeypatch):
    """assets/models/mini-dflash (the recipe's export): `--draft mini-dflash` finds it; model lists do not."""
    import assets

    (tmp_path / "mini-target").symlink_to(TARGET.path)
    write_block_drafter(tmp_path / "mini-dflash", TARGET.path)
    monkeypatch.setattr(assets, "MODELS_DIR", tmp_path)
    assert assets.embedded_names() == ["mini-target"]
    assert assets.embedded_names(drafters=True) == ["mini-dflash", "mini-target"]

"""The KV memory budget in bytes: `--max-kv` sizes, a shared budget that is never exceeded, slabs given back.

Chats grow step by step (prefills, decode steps, forks whose tables are several
runs of blocks) in two pools (two models) sharing one ``KVBudget`` until it runs
out; at every step the bytes taken stay within the budget and equal the MLX
arrays the pools hold, and running out is a ``PoolExhaustedError`` that changes
nothing.
"""

from __future__ import annotations

import json

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest

from app.cli import build_parser, main
from app.options import kv_config
from app.engine_host.failure_text import failure_title, with_hint
from app.tui.widgets.status_line import stats_text
from mlxcore.engine import Engine, KVConfig
from mlxcore.errors import PromptError, UsageError
from mlxcore.kv.budget import KVBudget, KVLimit, parse_max_kv, weights_bytes
from mlxcore.kv.errors import PoolExhaustedError
from mlxcore.kv.model_cache import ModelCache, make_block_pool, make_model_cache
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from tiny_models import tiny_qwen3
from bench.draft_lengths import FixedDraftLength

TARGET = tiny_qwen3(seed=5)
DRAFT = tiny_qwen3(seed=6, layers=1)
VOCAB = TARGET.args.vocab_size
TARGET_BYTES = weights_bytes(TARGET)


@pytest.mark.parametrize("text, limit", [
    ("1MB", KVLimit(bytes=10**6)), ("512MB", KVLimit(bytes=512 * 10**6)), ("8GB", KVLimit(bytes=8 * 10**9)),
    ("1.5GiB", KVLimit(bytes=3 * 2**29)), ("200 KiB", KVLimit(bytes=200 * 1024)), ("4096", KVLimit(tokens=4096)),
    ("2gb", KVLimit(bytes=2 * 10**9)),
])
def test_max_kv_takes_tokens_or_a_size(text, limit):
    assert parse_max_kv(text) == limit


@pytest.mark.parametrize("text", ["12x", "0", "-5", "1.5", "", "GB", "0MB", "8 GBs", "1e9"])
def test_bad_max_kv_values_are_refused_with_a_sentence(text):
    with pytest.raises(ValueError, match="max_kv"):  # (the API's name; the command line says --max-kv)
        parse_max_kv(text)


def test_options_give_the_engine_a_byte_budget():
    args = build_parser().parse_args(["ask", "hi", "--max-kv", "1MB", "--disk-kv", "0"])
    assert kv_config(args) == KVConfig(kind="paged", max_kv=None, max_kv_bytes=10**6)
    args = build_parser().parse_args(["ask", "hi", "--max-kv", "300", "--disk-kv", "0"])
    assert kv_config(args) == KVConfig(kind="paged", max_kv=300)
    with pytest.raises(UsageError, match="number of tokens"):
        kv_config(build_parser().parse_args(["ask", "hi", "--kv", "rotating", "--max-kv", "1GB"]))


def test_a_bad_max_kv_is_one_line_on_stderr_not_a_traceback(capsys):
    assert main(["ask", "--model", "mini-target", "--max-kv", "12x", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlxchat: --max-kv '12x' is neither") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def feed(model, cache: ModelCache, ids: list[int]) -> None:
    cache.begin(len(ids))
    mx.eval(model(mx.array([ids]), cache=cache.layers))


def held_arrays(pools) -> int:
    """Bytes of the MLX arrays the pools' slabs hold."""
    return sum(layer.nbytes for pool in pools for layer in pool.storage)


def test_a_budget_of_n_bytes_is_never_exceeded_and_running_out_is_typed():
    rng = np.random.default_rng(0)
    budget = KVBudget(100_000)
    pools = [make_block_pool(model, block_size=4, slab_blocks=8, budget=budget) for model in (TARGET, DRAFT)]
    caches, refused = [], 0
    for step in range(400):
        pool_index = step % 2
        model = (TARGET, DRAFT)[pool_index]
        mine = [c for c in caches if c.pool is pools[pool_index]]
        if not mine or step % 37 == 0:  # a new chat, or a fork of one (its table then reads several runs)
            cache = mine[-1].fork() if mine and step % 74 == 0 else make_model_cache(model, "paged", pool=pools[pool_index])
            caches.append(cache)
        else:
            cache = mine[int(rng.integers(len(mine)))]
        ids = [int(t) for t in rng.integers(0, VOCAB, 1 if cache.offset else 9)]
        before = (cache.offset, list(cache.pool.manager.block_ids(cache.seq_id)), budget.in_use)
        try:
            feed(model, cache, ids)
        except PoolExhaustedError as error:
            refused += 1
            assert "KV cache memory is full" in str(error)
            assert (cache.offset, cache.pool.manager.block_ids(cache.seq_id), budget.in_use) == before, \
                "a refused append changes nothing"
        assert budget.in_use <= budget.limit and budget.peak <= budget.limit
        assert budget.in_use == sum(pool.kv_bytes for pool in pools) == held_arrays(pools)
    assert refused > 10, "the chats grew until the budget ran out"
    assert any(len(cache._gather_index().runs) > 1 for cache in caches), "tables of several runs were read"
    for cache in caches:
        cache.release()
    for pool in pools:
        pool.release_free_slabs(cached=True)
    assert budget.in_use == 0 and all(pool.kv_bytes == 0 for pool in pools)


def test_slabs_are_added_without_copying_and_given_back_when_chats_close():
    budget = KVBudget(10**8)
    pool = make_block_pool(TARGET, block_size=4, slab_blocks=4, budget=budget)
    chat = make_model_cache(TARGET, "paged", pool=pool)
    feed(TARGET, chat, list(range(1, 10)))
    first = pool.storage[0].slabs[0]
    for token in range(55):  # to 64 tokens: 16 blocks, 4 full slabs
        feed(TARGET, chat, [token + 1])
    assert pool.storage[0].slabs[0] is first, "growing adds slabs; the first one is the same array"
    assert pool.slabs == 4 and pool.bytes_allocated == 4 * 4 * pool.block_bytes
    assert len(chat._gather_index().runs) == 4, "a chat across slabs is read as one run per slab"
    assert budget.peak == pool.bytes_allocated, "never two copies of the storage at once"
    other = make_model_cache(TARGET, "paged", pool=pool)
    feed(TARGET, other, [7] * 3)  # one partial block (no hash to keep), in a fifth slab
    assert pool.slabs == 5
    other.release()
    assert pool.slabs == 4 and budget.in_use == pool.kv_bytes, "its slab went back when it closed"
    chat.release(list(range(1, 10)) + [token + 1 for token in range(55)])  # its full blocks stay cached
    assert pool.release_free_slabs(cached=True) > 0 and budget.in_use == 0 and pool.slabs == 0


def test_a_full_budget_gives_back_cached_prefixes_of_the_other_model_before_refusing():
    budget = KVBudget(8 * make_block_pool(TARGET, block_size=4).block_bytes)  # one slab of the target's
    target, draft = (make_block_pool(model, block_size=4, slab_blocks=8, budget=budget) for model in (TARGET, DRAFT))
    old = make_model_cache(TARGET, "paged", pool=target)
    feed(TARGET, old, list(range(1, 31)))
    old.release(list(range(1, 31)))  # its full blocks stay as a cached prefix, in the target's slab
    assert target.slabs == 1 and budget.free == 0
    chat = make_model_cache(DRAFT, "paged", pool=draft)
    feed(DRAFT, chat, list(range(1, 20)))  # the draft needs a slab: the target's cached one makes room
    assert chat.offset == 19 and target.slabs == 0 and budget.in_use == draft.kv_bytes <= budget.limit


# What MLX's device_info says: Metal's keys, CUDA's (mlx/backend/cuda/device_info.cpp), the CPU's.
METAL = {"architecture": "applegpu_g15s", "memory_size": 32 * 10**9, "max_recommended_working_set_size": 22 * 10**9}
CUDA = {"device_name": "NVIDIA H200", "architecture": "sm_90", "total_memory": 80 * 10**9, "free_memory": 30 * 10**9}
CPU = {"architecture": "x86_64", "device_name": "Intel(R) Xeon(R) Processor"}
RAM = 40 * 10**9


@pytest.mark.parametrize("kind, info, budget, memory", [
    ("gpu", METAL, 22e9 - TARGET_BYTES - 2.2e9, (22e9, "usable by the GPU")),  # the working set less the weights
    ("gpu", CUDA, 30e9 - 8e9, (80e9, "usable by the GPU")),  # no more than is free (the weights already out of it)
    ("gpu", CPU, RAM - 4e9, None),  # the GPU profile forced on the CPU backend: its RAM
    ("cpu", METAL, RAM - 4e9, None),  # the CPU profile reads no GPU's memory
], ids=["metal", "cuda", "gpu-profile-on-the-cpu", "cpu"])
def test_the_machine_budget_is_the_memory_of_the_device_mlx_runs_on(monkeypatch, kind, info, budget, memory):
    """The engine's default budget (no --max-kv) and the out-of-memory message read the device's memory the one
    way the device profile gives; each GPU's branch forced on the CPU backend with that GPU's device_info."""
    from mlxcore import device_profile, out_of_memory
    from mlxcore.kv import budget as kv_budget

    monkeypatch.setattr(device_profile, "_forced", device_profile.PROFILES[kind])
    monkeypatch.setattr(mx, "device_info", lambda: info)
    monkeypatch.setattr(kv_budget, "available_ram", lambda: RAM)
    assert Engine(TARGET, kv=KVConfig(kind="paged")).kv_budget.limit == int(budget)
    size, what = out_of_memory.machine_memory()
    assert (size, what) == ((int(memory[0]), memory[1]) if memory else (size, "of memory"))


@pytest.mark.parametrize("names, expected", [
    ({"SC_AVPHYS_PAGES": 3, "SC_PHYS_PAGES": 8, "SC_PAGE_SIZE": 4096}, 3 * 4096),  # another Unix: free pages
    ({"SC_PHYS_PAGES": 8, "SC_PAGE_SIZE": 16384}, 8 * 16384),  # macOS names no free pages: every page
    ({"SC_PAGE_SIZE": 4096}, None),  # neither: a message that says what to do
], ids=["free-pages", "macos", "unknown"])
def test_available_ram_without_proc_meminfo(monkeypatch, names, expected):
    """MLX on a Mac's CPU (or another Unix) has no /proc/meminfo; os.sysconf raises ValueError for a name the
    platform does not define, as Python does on macOS for SC_AVPHYS_PAGES."""
    import builtins
    import os

    from mlxcore.errors import MlxchatError
    from mlxcore.kv import budget as kv_budget

    real_open = builtins.open

    def no_proc(path, *args, **kwargs):
        if str(path) == "/proc/meminfo":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    def sysconf(name):
        if name not in names:
            raise ValueError(f"unrecognized configuration name {name!r}")
        return names[name]

    monkeypatch.setattr(builtins, "open", no_proc)
    monkeypatch.setattr(os, "sysconf", sysconf)
    if expected is None:
        with pytest.raises(MlxchatError, match="--max-kv"):
            kv_budget.available_ram()
    else:
        assert kv_budget.available_ram() == expected


@pytest.mark.parametrize("draft_length", [0, 2], ids=["draft-left-behind", "draft-keeps-pace"])
def test_the_engine_shares_one_budget_between_target_and_draft(draft_length):
    """Fixed draft lengths, as the adaptive one follows the host's timings. Kept pace with, the draft's cache
    holds the slab the target's next block needs near the limit: the draft gives it back, the reply goes on."""
    engine = Engine(TARGET, kv=KVConfig(kind="paged", max_kv_bytes=300_000), draft_model=DRAFT)
    engine.eos_ids = set()
    engine.draft_control = FixedDraftLength(draft_length, max_k=engine.draft_control.max_k)
    caches = engine.new_caches()
    assert caches.target.pool.budget is caches.draft.pool.budget is engine.kv_budget
    prompt = list(range(1, 40))
    events = list(engine.generate(prompt, caches, GenerationParams(max_tokens=2000)))
    assert events[-1].finish_reason == "length", "the reply ends where the budget does, as at its token cap"
    assert len(prompt) + len(events) - 1 == engine.token_limit() < len(prompt) + 2000
    assert engine.kv_budget.peak <= 300_000
    list(engine.generate(prompt + [7], caches, GenerationParams(max_tokens=4)))
    assert engine.last_stats.reused_tokens == len(prompt), "the chat's caches stay its own for the next turn"


def test_ask_says_what_is_full_and_what_to_do(capsys):
    status = main(["ask", "--model", "mini-target", "--no-draft", "--no-think", "--max-kv", "30KB", "Hello there"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "The KV cache memory is full" in err and "30.0 KB budget" in err and "larger --max-kv" in err


def test_the_chat_window_says_what_to_do():
    text = with_hint(PoolExhaustedError("The KV cache memory is full: 9 more tokens do not fit."), fatal=False)
    assert failure_title(PoolExhaustedError("")) == "Cache memory is full"
    assert "ctrl+n" in text and "--max-kv" in text


def test_stats_report_the_kv_bytes_in_use_and_the_budget(capsys):
    engine = Engine(TARGET, kv=KVConfig(kind="paged", max_kv_bytes=2_000_000), draft_model=DRAFT)
    caches = engine.new_caches()
    list(engine.generate(list(range(1, 40)), caches, GenerationParams(max_tokens=8)))
    stats = engine.last_stats
    assert stats.kv_budget_bytes == 2_000_000 and 0 < stats.kv_bytes == engine.kv_budget.in_use <= 2_000_000
    line = stats_text({"kv_bytes": stats.kv_bytes, "kv_budget_bytes": stats.kv_budget_bytes})
    assert f"KV {stats.kv_bytes / 1e6:.0f} MB/2 MB" in line
    status = main(["ask", "--model", "mini-target", "--no-draft", "--no-think", "--max-kv", "64MB", "--max-tokens",
                   "4", "--json", "Hello there"])
    shown = json.loads(capsys.readouterr().out.splitlines()[-1])["stats"]  # the final event's line
    assert status == 0 and shown["kv_budget_bytes"] == 64_000_000 and 0 < shown["kv_bytes"] <= 64_000_000



def test_a_turn_refused_for_kv_memory_leaves_no_trace_in_the_chat():
    """A prompt the budget cannot hold is refused before its prefill: the message is not kept, the cache
    holds what it held before, and a short turn then works."""
    from sessions.chat_session import ChatSession
    from turn_checks import send_matching_a_cold_run

    loaded = load_model("mini-target")
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged", max_kv_bytes=400_000))
    session = ChatSession(engine, params=GenerationParams(max_tokens=8))
    session.enable_thinking = False
    session.send("Hi")
    before = list(session.messages)
    with pytest.raises(PromptError, match="KV cache memory is full"):
        session.send("The quick brown fox jumps over the lazy dog. " * 60)
    assert session.messages == before, "the refused message is not in the history"
    send_matching_a_cold_run(session, "And 3 + 4?")

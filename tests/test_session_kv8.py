"""Session files and the session store with 8-bit KV caches: blocks saved as the pool stores them.

References: the saved cache's own ``state_dict`` (a restore is bit for bit), a cold run on a
fresh engine with the same bits (the next turn), ``mx.quantize`` / ``mx.dequantize`` of the
saved tensors (a file opened by an engine of another format), and a float chat of the same
tokens (the store keeps the two apart).
"""

from __future__ import annotations

from functools import cache

import pytest

from session_file_forms import appending, cache_bytes, file_tensors, save_whole
from session_kill_helper import WINDOW
from turn_checks import same_state, send_matching_a_cold_run

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from bench.draft_lengths import FixedDraftLength
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.launch import ModelChoice, open_engine
from mlxcore.params import GenerationParams
from sessions.block_files import BlockFiles
from sessions.block_keys import chain_keys, layout_salt
from sessions.chat_session import ChatSession
from sessions.file_format import read_header
from sessions.store import SessionStore
from sessions.store_index import StoreIndex

PARAMS = GenerationParams(max_tokens=12)
TURNS = ("Hello there, how are you today?", "Tell me about the maps of Canada and Mexico.")
NEXT = "And what about the rivers?"


@cache
def _pair():
    opened = open_engine(ModelChoice(model="mini-target", draft="mini-draft"), KVConfig(kind="paged"))
    return opened.engine


def engine(kind: str = "paged", bits: int | None = 8, window: int | None = None) -> Engine:
    """A fresh engine on the embedded pair (heads of 32: groups of 32), nothing cached, fixed draft length."""
    pair = _pair()
    kv = KVConfig(kind=kind, max_kv=window or WINDOW.get(kind), kv_bits=bits)
    made = Engine(pair.model, pair.tokenizer, kv=kv,
                  draft_model=pair.draft_model, context_length=pair.context_length,
                  fingerprint=pair.fingerprint, draft_fingerprint=pair.draft_fingerprint)
    made.draft_control = FixedDraftLength(4)
    return made


def chat(made: Engine, turns=TURNS) -> ChatSession:
    session = ChatSession(made, "You are a helpful assistant.", PARAMS)
    for text in turns:
        session.send(text)
    return session


# --- session files --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["paged", "rotating"])
def test_an_8bit_chat_restores_bit_for_bit_and_answers_like_a_cold_run(kind, tmp_path):
    path = tmp_path / "chat.mlxchat"
    original = chat(engine(kind))
    original.save(path)
    header = read_header(path)
    assert header["version"] == 3 and header["cache"]["target"]["kv_format"] == "q8g32"
    tensors = file_tensors(path)
    assert tensors["target.0.keys"].dtype == mx.uint32, "saved as stored, not dequantized"
    restored = ChatSession.load(path, engine(kind))  # a fresh engine: nothing shared
    assert restored.restore_note is None and restored.history == original.history
    for role in ("target", "draft"):
        assert same_state(restored.caches, original.caches, role), role
    send_matching_a_cold_run(restored, NEXT)
    assert restored.last_stats.reused_tokens > len(original.caches.tokens) // 2


def test_an_8bit_file_is_a_third_of_the_float_files_size(tmp_path):
    """The embedded pair (float32, heads of 32): 8-bit blocks take 40 of 128 bytes a head and token."""
    original = chat(engine(bits=None))
    original.save(tmp_path / "float.mlxchat")
    converted = ChatSession.load(tmp_path / "float.mlxchat", engine(bits=8))  # the same tokens in 8 bits
    converted.save(tmp_path / "q8.mlxchat")
    sizes = {name: cache_bytes(tmp_path / f"{name}.mlxchat") for name in ("float", "q8")}
    assert 0.30 < sizes["q8"] / sizes["float"] < 0.34, sizes


@pytest.mark.parametrize("bits, version", [(None, 1), (8, 2)])
def test_a_whole_file_of_an_earlier_mlxchat_opens_and_its_next_save_appends(bits, version, tmp_path):
    """Versions 1 (float) and 2 (8-bit) were whole files: they open as they were, and the first save
    writes the appending layout (format 3), which the save after appends to."""
    path = tmp_path / "f.mlxchat"
    original = chat(engine(bits=bits))
    save_whole(original, path)
    assert read_header(path)["version"] == version and not appending(path)
    restored = ChatSession.load(path, engine(bits=bits))
    assert restored.restore_note is None and same_state(restored.caches, original.caches)
    restored.save(path)
    assert appending(path) and read_header(path)["version"] == 3
    before = path.read_bytes()
    restored.send(NEXT)
    restored.save(path)
    after = path.read_bytes()
    assert len(after) > len(before) and after.startswith(before), "appended: what was there is kept"
    assert same_state(ChatSession.load(path, engine(bits=bits)).caches, restored.caches)


@pytest.mark.parametrize("saved_bits, engine_bits", [(8, None), (None, 8)])
def test_a_file_of_another_kv_format_opens_converted_says_so_and_answers(saved_bits, engine_bits, tmp_path):
    path = tmp_path / "chat.mlxchat"
    original = chat(engine(bits=saved_bits))
    original.save(path)
    saved = file_tensors(path)
    restored = ChatSession.load(path, engine(bits=engine_bits))
    was, now = ("8-bit", "float") if saved_bits else ("float", "8-bit")
    assert f"saved with a{'n' if was == '8-bit' else ''} {was} KV cache" in restored.restore_note
    assert f"keeps a{'n' if now == '8-bit' else ''} {now} KV cache" in restored.restore_note
    assert "converted" in restored.restore_note and restored.history == original.history
    for role in ("target", "draft"):
        cache = getattr(restored.caches, role)
        held = restored.caches.ids[:cache.offset]
        assert cache.geometry.format.bits == engine_bits and held == original.caches.ids[:cache.offset]
        assert cache.offset == getattr(original.caches, role).offset
        tensors, _ = cache.state_dict(held)
        for name, array in converted(saved, role, saved_bits).items():
            assert mx.array_equal(tensors[name], array).item(), f"{role}.{name}"
    restored.send(NEXT)
    assert restored.last_stats.reused_tokens > len(original.caches.tokens) // 2, "the converted cache is used"


def converted(saved: dict, role: str, saved_bits: int | None) -> dict:
    """The reference: the saved tensors dequantized (8-bit file) or quantized (float file) by MLX itself."""
    layers = {name.split(".")[1] for name in saved if name.startswith(role)}
    out = {}
    for layer in layers:
        for part in ("keys", "values"):
            name = f"{role}.{layer}.{part}"
            if saved_bits:
                out[f"{layer}.{part}"] = mx.dequantize(saved[name], saved[f"{name}.scales"], saved[f"{name}.biases"],
                                                       group_size=32, bits=8)
            else:
                packed, scales, biases = mx.quantize(saved[name], group_size=32, bits=8)
                out |= {f"{layer}.{part}": packed, f"{layer}.{part}.scales": scales,
                        f"{layer}.{part}.biases": biases}
    return out


def test_a_rotating_window_of_another_format_is_rebuilt(tmp_path):
    """A window keeps the format it was saved in (mlxcore's rotating restore): the engine's is used instead."""
    path = tmp_path / "w.mlxchat"
    original = chat(engine("rotating", bits=8), TURNS[:1])
    original.save(path)
    restored = ChatSession.load(path, engine("rotating", bits=None))
    assert "rebuilt" in restored.restore_note and restored.caches.target.offset == 0
    assert restored.caches.target.geometry.format.bits is None
    assert restored.send(NEXT)


# --- the session store ----------------------------------------------------------------------------

def keys_of(store: SessionStore, chat_id: str) -> dict[str, list[str]]:
    record = StoreIndex(store.root).read(chat_id)
    return {role: [block.key for block in blocks] for role, blocks in record.blocks.items()}


def tokens_of(store: SessionStore, chat_id: str) -> bytes:
    return b"".join(block.tokens for block in StoreIndex(store.root).read(chat_id).blocks["target"])


@pytest.fixture
def store(tmp_path):
    store = SessionStore(tmp_path / "sessions")
    yield store
    store.close()


def test_the_store_keeps_a_shared_8bit_prefix_once_and_float_blocks_apart(store, tmp_path):
    first = chat(engine())
    second = first.fork()
    second.send("Which of them is larger?")
    a, b = store.save(first).id, store.save(second).id
    keys_a, keys_b = keys_of(store, a), keys_of(store, b)
    shared = set(keys_a["target"]) & set(keys_b["target"])
    assert len(shared) >= len(first.caches.tokens) // 16 - 1, "the fork's prefix blocks are the first's"
    every = {key for keys in (keys_a, keys_b) for role in keys.values() for key in role}
    assert set(BlockFiles(store.root).keys()) == every, "one file per distinct block"
    # The same tokens in a float cache: a chat of its own blocks, none shared with the 8-bit one.
    first.save(tmp_path / "a.mlxchat")
    as_float = ChatSession.load(tmp_path / "a.mlxchat", engine(bits=None))
    c = store.save(as_float).id
    assert tokens_of(store, c) == tokens_of(store, a)
    assert not {k for role in keys_of(store, c).values() for k in role} & every
    store.close()
    other = SessionStore(store.root)  # another store, fresh engines: nothing shared
    try:
        for chat_id, original, bits in ((a, first, 8), (b, second, 8), (c, as_float, None)):
            reopened = other.load(chat_id, engine(bits=bits))
            assert reopened.restore_note is None, chat_id
            for role in ("target", "draft"):
                assert same_state(reopened.caches, original.caches, role), (chat_id, role)
    finally:
        other.close()


@pytest.mark.parametrize("kind", ["paged", "rotating"])
def test_a_stored_8bit_chat_opens_with_the_caches_it_was_saved_with(kind, store):
    make = lambda: engine(kind, window=48 if kind == "rotating" else None)  # noqa: E731
    original = chat(make())
    if kind == "rotating":
        assert original.caches.target.layers[0].wrapped, "a wrapped 8-bit window is stored whole"
    chat_id = store.save(original).id
    store.close()
    other = SessionStore(store.root)
    try:
        restored = other.load(chat_id, make())
        assert restored.restore_note is None and restored.history == original.history
        for role in ("target", "draft"):
            assert same_state(restored.caches, original.caches, role), role
        prompt = original.caches.tokens + [5, 6, 7]  # extends the cache: no rewind past the window
        assert continuation(restored, prompt) == continuation(original, prompt)
    finally:
        other.close()


def continuation(session: ChatSession, prompt: list[int]) -> list[int]:
    return [e.token for e in session.engine.generate(prompt, session.caches, PARAMS) if isinstance(e, TokenEvent)]


def test_a_stored_8bit_chat_continued_in_float_is_saved_as_float_blocks(store):
    """The user switches --kv-bits off: the chat opens converted, and its next autosave replaces its blocks."""
    original = chat(engine())
    chat_id = store.save(original).id
    before = set(BlockFiles(store.root).keys())
    store.release(chat_id)
    opened = store.load(chat_id, engine(bits=None))
    assert "converted" in opened.restore_note
    opened.send(NEXT)
    store.save(opened)
    after = {key for role in keys_of(store, chat_id).values() for key in role}
    assert not after & before and set(BlockFiles(store.root).keys()) == after, "the 8-bit blocks were collected"
    assert store.read(chat_id).version == 1
    store.release(chat_id)
    again = store.load(chat_id, engine(bits=None))
    assert again.restore_note is None and same_state(again.caches, opened.caches)


def test_float_block_keys_are_those_stores_already_hold():
    """Quantized formats salt their keys; float ones are unchanged, so stores written before keep their blocks."""
    layout = {"0.keys": ("F32", (1, 2, -1, 32)), "0.values": ("F32", (1, 2, -1, 32))}
    tokens = list(range(20))
    assert chain_keys(layout_salt("model-a", "target", "positional", layout), tokens)[1].key == \
        "aa2cc095e03d8dca964deaf0d457f4643b5a1451"
    quantized = chain_keys(layout_salt("model-a", "target", "positional", layout, "q8g32"), tokens)
    assert quantized[1].key != "aa2cc095e03d8dca964deaf0d457f4643b5a1451"


def test_an_8bit_chat_exports_as_one_file_and_a_damaged_block_costs_only_its_cache(store, tmp_path):
    original = chat(engine())
    chat_id = store.save(original).id
    store.export_file(chat_id, tmp_path / "out.mlxchat")
    assert read_header(tmp_path / "out.mlxchat")["version"] == 3 and appending(tmp_path / "out.mlxchat")
    exported = ChatSession.load(tmp_path / "out.mlxchat", engine())
    assert same_state(exported.caches, original.caches)
    store.close()
    victim = BlockFiles(store.root).path(keys_of(store, chat_id)["target"][1])
    victim.write_bytes(victim.read_bytes()[:-40])  # a truncated quantized block
    reopened = SessionStore(store.root).load(chat_id, engine())
    assert reopened.history == original.history and reopened.caches.target.offset == 0
    assert "could not be read" in reopened.restore_note and "damaged" in reopened.restore_note
    assert reopened.send(NEXT)


def test_the_file_ratio_bench_row():
    from bench.session_kv8 import kv8_session_file_ratio
    row = kv8_session_file_ratio("mini-target", "mini-draft", min_tokens=200)
    assert row["tokens"] >= 200 and row["format_ratio"] == 40 / 128
    assert row["payload_ratio"] == pytest.approx(row["format_ratio"], abs=0.01) and row["value"] < 0.55

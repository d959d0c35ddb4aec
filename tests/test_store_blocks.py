"""The session store's incremental saves: blocks shared by content, written once, collected when unused.

Every test saves real chats (tiny random models, the embedded tokenizer) into a store and
checks what reached the disk (the block files, the index's rows) and that every chat opens
again with exactly the caches it was saved with.
"""

from __future__ import annotations

import argparse
import dataclasses
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from session_kill_helper import tiny_engine

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from app.sessions_cmd import add_sessions_parser, run_sessions
from mlxcore.params import GenerationParams
from bench.session_restore import measure_store_restore
from sessions.block_files import BlockFiles
from sessions.block_keys import BLOCK_TOKENS, chain_keys, layout_salt
from sessions.chat_session import ChatSession
from sessions.errors import SessionFileError, SessionNotFoundError
from sessions.file_format import read_header
from sessions.file_read import read_contents
from sessions.salvage import save_history
from sessions.store import SessionStore
from sessions.store_index import StoreIndex
from turn_checks import same_state

PARAMS = GenerationParams(max_tokens=12)
NOTES = " ".join(f"Note {i}: the shop on street {i * 7} sold {i * 3 + 11} apples and {i + 4} pears on day {i}."
                 for i in range(110))  # ~2,100 tokens of the embedded tokenizer


def close_state(a, b, role: str = "target") -> bool:
    (ta, ma), (tb, mb) = getattr(a, role).state_dict(a.ids), getattr(b, role).state_dict(b.ids)
    return ma == mb and ta.keys() == tb.keys() and all(mx.allclose(ta[k], tb[k], atol=1e-4).item() for k in ta)


def chat(engine, *turns: str, system: str = "You are a helpful assistant.") -> ChatSession:
    session = ChatSession(engine, system, PARAMS)
    for text in turns:
        session.send(text)
    return session


def keys_of(store: SessionStore, chat_id: str) -> dict[str, list[str]]:
    """role -> the keys of the blocks the index lists for the chat, in order."""
    record = StoreIndex(store.root).read(chat_id)
    return {role: [block.key for block in blocks] for role, blocks in record.blocks.items()}


def on_disk(store: SessionStore) -> set[str]:
    return set(BlockFiles(store.root).keys())


def all_keys(*chats: dict[str, list[str]]) -> set[str]:
    return {key for keys in chats for role in keys.values() for key in role}


@pytest.fixture
def store(tmp_path) -> SessionStore:
    store = SessionStore(tmp_path / "sessions")
    yield store
    store.close()


@pytest.mark.parametrize("kind", ["paged", "standard", "rotating"])
def test_a_stored_chat_opens_with_the_caches_it_was_saved_with(kind, store):
    make = lambda: tiny_engine(kind, max_kv=48 if kind == "rotating" else None)  # noqa: E731
    original = chat(make(), "Hello there, how are you today?", "Tell me about the maps of Canada.")
    if kind == "rotating":
        assert original.caches.target.layers[0].wrapped, "a wrapped window is stored whole"
    chat_id = store.save(original).id
    store.close()
    restored = SessionStore(store.root).load(chat_id, make())  # another store, a fresh engine: nothing shared
    assert restored.restore_note is None and restored.history == original.history
    for role in ("target", "draft"):
        assert same_state(restored.caches, original.caches, role), role
    assert restored.send("And the rivers?") == original.send("And the rivers?")


def test_bfloat16_caches_round_trip(store):
    original = chat(tiny_engine("standard", dtype="bfloat16"), "Hello there!")
    restored = store.load(store.save(original).id, tiny_engine("standard", dtype="bfloat16"))
    assert same_state(restored.caches, original.caches)


def test_two_chats_sharing_a_2000_token_prefix_store_it_once(store):
    engine = tiny_engine("paged")
    first = chat(engine, f"{NOTES}\nWhich street sold the most apples?")
    second = chat(engine, f"{NOTES}\nHow many pears were sold on day 3?")
    shared = _common_prefix(first.caches.tokens, second.caches.tokens)
    assert shared >= 2000
    a = store.save(first).id
    written_by_first = store.last_save.blocks_written
    b = store.save(second).id
    keys_a, keys_b = keys_of(store, a), keys_of(store, b)
    for role in ("target", "draft"):
        common = set(keys_a[role]) & set(keys_b[role])
        assert len(common) == shared // BLOCK_TOKENS, f"{role}: every full block of the shared prefix is shared"
    assert store.last_save.blocks_written == len(all_keys(keys_b) - all_keys(keys_a)), "the second adds only its own"
    assert store.last_save.blocks_kept == 2 * (shared // BLOCK_TOKENS)
    assert written_by_first == len(all_keys(keys_a))
    assert on_disk(store) == all_keys(keys_a, keys_b), "one file per distinct block, nothing else"
    for chat_id, original in ((a, first), (b, second)):
        assert same_state(store.load(chat_id, tiny_engine("paged")).caches, original.caches)


def test_a_fork_adds_no_blocks_and_a_regeneration_only_its_reply(store):
    original = chat(tiny_engine("paged"), f"{NOTES[:2000]}\nWhat did street 7 sell?")
    store.save(original)
    fork = original.fork()
    fork_id = store.save(fork).id
    assert (store.last_save.blocks_written, store.last_save.bytes_written) == (0, 0), "same tokens, same blocks"
    before = fork.caches.tokens
    fork.params = dataclasses.replace(fork.params, temperature=1.0, seed=7)
    fork.regenerate()
    after = fork.caches.tokens
    diverged = _common_prefix(before, after)
    assert diverged < len(after), "the regenerated reply differs"
    store.save(fork)
    new = {(role, key) for role, keys in keys_of(store, fork_id).items() for key in keys} - \
        {(role, key) for role, keys in keys_of(store, original.store_id).items() for key in keys}
    assert store.last_save.blocks_written == len(new)
    for role in ("target", "draft"):  # only the blocks from the one holding the first new token on
        tokens = fork.caches.ids[:getattr(fork.caches, role).offset]
        assert sum(r == role for r, _ in new) == -(-len(tokens) // BLOCK_TOKENS) - diverged // BLOCK_TOKENS


def test_an_autosave_writes_about_what_the_turn_added(store):
    session = chat(tiny_engine("paged"), f"{NOTES[:3000]}\nWhich street sold the most apples?")
    store.save(session)
    offsets = {role: getattr(session.caches, role).offset for role in ("target", "draft")}
    session.send("And pears?")
    store.save(session)
    added = sum((getattr(session.caches, r).offset - offsets[r]) * getattr(session.caches, r).geometry.token_bytes
                for r in offsets)
    assert 0 < store.last_save.bytes_written <= 2 * added, (store.last_save, added)


def test_garbage_collection_keeps_every_block_a_chat_holds(store):
    engine = tiny_engine("paged")
    first = chat(engine, f"{NOTES}\nWhich street sold the most apples?")
    second = first.fork()
    second.send("And the pears?")
    a, b = store.save(first).id, store.save(second).id
    tails_before = set(keys_of(store, b)["target"])
    second.send("And on day 4?")  # its old partial tail block is dropped and collected
    store.save(second)
    assert on_disk(store) == all_keys(keys_of(store, a), keys_of(store, b))
    assert tails_before - set(keys_of(store, b)["target"]), "a block was dropped by the save"
    store.delete(a)
    assert on_disk(store) == all_keys(keys_of(store, b)), "the first's own blocks went, the shared stayed"
    assert same_state(store.load(b, tiny_engine("paged")).caches, second.caches)
    store.delete(b)
    assert on_disk(store) == set()


def test_blocks_of_other_models_roles_and_dtypes_never_collide():
    layout = {"0.keys": ("F32", (1, 2, -1, 16)), "0.values": ("F32", (1, 2, -1, 16))}
    tokens = list(range(40))
    salts = [layout_salt("model-a", "target", "positional", layout),
             layout_salt("model-b", "target", "positional", layout),
             layout_salt("model-a", "draft", "positional", layout),
             layout_salt("model-a", "target", "positional", {k: ("BF16", s) for k, (_, s) in layout.items()}),
             layout_salt("model-a", "target", "positional", {"0.keys.q8": ("F32", (1, 2, -1, 4)), **layout})]
    keys = [tuple(ref.key for ref in chain_keys(salt, tokens)) for salt in salts]
    assert len({key for chain in keys for key in chain}) == len(salts) * 3  # 40 tokens: 2 full blocks + 1 partial
    same_start = chain_keys(salts[0], tokens[:32] + [99] * 8)
    assert [r.key for r in same_start[:2]] == list(keys[0][:2]) and same_start[2].key != keys[0][2]


def test_another_models_chat_holding_the_same_tokens_shares_nothing(store):
    one = chat(tiny_engine("paged", seed=0), "Hello there, how are you today?")
    other = ChatSession(tiny_engine("paged", seed=2), "You are a helpful assistant.", PARAMS)
    other.messages = list(one.messages)
    prompt = one.caches.tokens
    list(other.engine.generate(prompt, other.caches, dataclasses.replace(PARAMS, max_tokens=1)))
    assert other.caches.tokens[:len(prompt)] == prompt
    a, b = store.save(one).id, store.save(other).id
    assert not set(keys_of(store, a)["target"]) & set(keys_of(store, b)["target"])


def test_chat_files_of_earlier_versions_are_listed_opened_and_moved_in_on_save(store):
    engine = tiny_engine("paged")
    original = chat(engine, "Hello there, how are you today?")
    old = store.root / "20240101-000000-abcd.mlxchat"
    store.root.mkdir(parents=True)
    original.save(old)  # what an earlier mlxchat wrote into the store
    [info] = store.list()
    assert (info.id, info.in_file, info.messages) == ("20240101-000000-abcd", True, 2)
    opened = store.load(info.id, tiny_engine("paged"))
    assert same_state(opened.caches, original.caches) and opened.history == original.history
    opened.send("And now?")
    store.save(opened)
    assert not old.exists(), "moved into the index"
    [info] = store.list()
    assert (info.id, info.in_file, info.messages) == ("20240101-000000-abcd", False, 4)
    again = store.load(info.id, tiny_engine("paged"))
    assert same_state(again.caches, opened.caches)


def test_export_writes_one_self_contained_file(store, tmp_path):
    original = chat(tiny_engine("paged"), "Hello there, how are you today?")
    chat_id = store.save(original).id
    store.export_file(chat_id, tmp_path / "shared.mlxchat")
    store.delete(chat_id)
    assert on_disk(store) == set()
    restored = ChatSession.load(tmp_path / "shared.mlxchat", tiny_engine("paged"))
    assert restored.history == original.history and restored.restore_note is None
    for role in ("target", "draft"):
        assert same_state(restored.caches, original.caches, role)
    assert read_header(tmp_path / "shared.mlxchat")["version"] == 3, "the appending layout"
    commit = read_contents(tmp_path / "shared.mlxchat").commit
    assert commit.live_bytes == commit.end == (tmp_path / "shared.mlxchat").stat().st_size, "compact: no dead space"
    data = bytearray((tmp_path / "shared.mlxchat").read_bytes())
    data[-100] ^= 0xFF  # in the cache payload: validated on load like any session file
    (tmp_path / "damaged.mlxchat").write_bytes(bytes(data))
    with pytest.raises(SessionFileError, match="damaged|checksum|corrupt"):
        ChatSession.load(tmp_path / "damaged.mlxchat", tiny_engine("paged"))


def test_sessions_export_to_a_mlxchat_file_writes_a_session_file(store, tmp_path, capsys):
    original = chat(tiny_engine("paged"), "Hello there, how are you today?")
    chat_id = store.save(original).id
    store.close()  # the window quits: the CLI reads the store
    parser = argparse.ArgumentParser(prog="mlxchat")
    add_sessions_parser(parser.add_subparsers(dest="command"))
    target = tmp_path / "hello.mlxchat"
    args = parser.parse_args(["sessions", "--store", str(store.root), "export", chat_id, "-o", str(target)])
    assert run_sessions(args) == 0 and "mlxchat --session" in capsys.readouterr().out
    restored = ChatSession.load(target, tiny_engine("paged"))
    assert restored.history == original.history and same_state(restored.caches, original.caches, "draft")


def test_the_restore_bench_on_a_store(tmp_path):
    result = measure_store_restore(tiny_engine("paged", draft=False), 1, tmp_path / "sessions", min_tokens=300)
    # value is a timing ratio: the bench judges it; a test only that the row ran and measured
    assert result["tokens"] >= 300 and result["value"] > 0 and result["store_bytes"] > 0


def test_a_damaged_block_costs_the_cache_not_the_chat(store):
    original = chat(tiny_engine("paged"), "Hello there, how are you today?")
    chat_id = store.save(original).id
    store.close()
    victim = BlockFiles(store.root).path(keys_of(store, chat_id)["target"][1])
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    reopened = store.load(chat_id, tiny_engine("paged"))
    assert reopened.history == original.history and reopened.caches.target.offset == 0
    assert "could not be read" in reopened.restore_note and "damaged" in reopened.restore_note
    reopened.send("Still there?")
    store.save(reopened)  # the damaged block was removed, so this save wrote it again
    store.close()
    again = store.load(chat_id, tiny_engine("paged"))
    # Blocks are shared by tokens: the undamaged ones keep the first computation's values (equal to rounding)
    assert again.restore_note is None and close_state(again.caches, reopened.caches)


def test_salvage_writes_a_store_chats_history_and_keeps_its_cache(store):
    original = chat(tiny_engine("paged"), "Hello there, how are you today?")
    chat_id = store.save(original).id
    store.close()
    shown = [(m.role, m.content) for m in original.history[1:]] + [("user", "More?"), ("assistant", "Part of a")]
    assert save_history(store.path_for(chat_id), shown) is True
    assert save_history(store.path_for(chat_id), shown) is False, "nothing to write the second time"
    reopened = store.load(chat_id, tiny_engine("paged"))
    assert [(m.role, m.content) for m in reopened.history[1:]] == shown
    assert same_state(reopened.caches, original.caches), "the saved cache is kept as it was"
    assert store.info(chat_id).messages == 4


def test_listing_reads_the_index_rows_only(store):
    engine = tiny_engine("paged")
    ids = [store.save(chat(engine, f"Chat number {n}")).id for n in range(3)]
    with sqlite3.connect(store.root / "store.sqlite") as db:
        db.execute("UPDATE chats SET header = 'not json'")  # only opening a chat reads the header
    assert sorted(info.id for info in store.list()) == sorted(ids)
    assert [info.title for info in store.search("number 1")] == ["Chat number 1"]
    with pytest.raises(SessionNotFoundError):
        store.read("no-such-chat")


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_what_the_chat_window_uses_of_the_store_does_not_import_mlx():
    """The window's process writes history into the store when the engine died (sessions.salvage)."""
    code = ("import sys, sessions.salvage, sessions.store_gc, sessions.block_files\n"
            "assert not any(m == 'mlx' or m.startswith(('mlx.', 'mlx_lm')) for m in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent).returncode == 0

"""The KV disk tier under the paged pool (issue 61), at the engine: what leaves memory is read back, never
wrong; damaged, foreign or half-written blocks are misses; a full disk stops the writing and says so once.
(The restart of a real server is tests/test_serve_disk_kv.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.engine_host.reply_stream import stats_dict
from app.tui.widgets.status_line import stats_text
from mlxcore import GenerationParams, KVConfig, ModelChoice, open_engine
from mlxcore.kv.block_frame import block_payload
from mlxcore.kv.block_manager import chain_hash
from mlxcore.kv.disk_tier import DiskTier, drain_disk_tiers

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [(i * 7919) % 1000 + 10 for i in range(600)]  # 37 full blocks of 16 and a partial one
GREEDY = GenerationParams(temperature=0, max_tokens=6)


def engine(folder: Path, **kv):
    return open_engine(ModelChoice(model="mini-target", no_draft=True),
                       KVConfig(disk_kv_bytes=1 << 30, disk_kv_dir=str(folder), **kv)).engine


def reply(engine) -> tuple[list[int], int]:
    """Greedy tokens for PROMPT on fresh caches, and the prompt tokens not computed; the caches released."""
    caches = engine.new_caches()
    tokens = [event.token for event in engine.generate(PROMPT, caches, GREEDY) if hasattr(event, "token")]
    caches.target.release(caches.ids)
    return tokens, engine.last_stats.reused_tokens


def leave_memory(engine) -> None:
    engine.release_kv()  # as an unload or a stopping server: every cached block leaves memory
    drain_disk_tiers()


def block_path(engine, folder: Path, index: int) -> Path:
    parent = None
    for start in range(0, (index + 1) * 16, 16):
        parent = chain_hash(parent, PROMPT[start:start + 16])
    key = engine.pool("target").disk.key(parent)
    return folder / "blocks" / key[:2] / key


def test_blocks_that_left_memory_are_read_back_and_damage_is_a_miss(tmp_path):
    first = engine(tmp_path)
    cold, reused = reply(first)
    assert reused == 0
    leave_memory(first)
    flipped, cut = block_path(first, tmp_path, 10), block_path(first, tmp_path, 20)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 1  # one byte of its keys and values
    flipped.write_bytes(bytes(data))

    second = engine(tmp_path)  # another engine (its pool empty): the disk's blocks up to the flipped one
    tokens, reused = reply(second)
    assert (tokens, reused) == (cold, 10 * 16)
    assert not flipped.exists()  # the damaged block is gone; the recomputed one goes to disk when it leaves
    leave_memory(second)
    assert flipped.exists()
    cut.write_bytes(cut.read_bytes()[:-100])  # truncated

    third = engine(tmp_path)
    assert reply(third) == (cold, 20 * 16)
    assert third.pool("target").disk.hit_tokens == 20 * 16
    # The window's status line tells the disk's hits from memory's (the engine host sends it these stats).
    assert third.last_stats.disk_reused_tokens == 20 * 16
    assert "reused 320/600 (320 from disk)" in stats_text(stats_dict(third.last_stats, None))


def test_blocks_of_another_kv_format_or_block_size_never_mix(tmp_path):
    first = engine(tmp_path)
    cold, _ = reply(first)
    leave_memory(first)
    assert reply(engine(tmp_path, kv_bits=8))[1] == 0  # 8-bit finds no float block
    assert reply(engine(tmp_path, block_size=32))[1] == 0
    assert reply(engine(tmp_path))[1] == 592  # the float pool of 16-token blocks finds its own


def test_where_computing_measures_faster_than_reading_the_tier_is_not_read(tmp_path):
    first = engine(tmp_path)
    cold, _ = reply(first)
    pace = first.pool("target").disk.pace
    assert pace.compute_seconds is not None and pace.read_seconds is None  # its prompt's prefill was timed
    leave_memory(first)

    second = engine(tmp_path)
    second.new_caches()  # (its pool, under which the tier goes)
    slow = second.pool("target").disk
    slow.pace.timed_read(64, 64.0)  # as a disk that reads a token in a second
    slow.pace.timed_compute(64, 0.064)
    assert reply(second) == (cold, 0) and slow.hit_tokens == 0  # every token computed, none read

    third = engine(tmp_path)  # measured the other way round: read back
    third.new_caches()
    fast = third.pool("target").disk
    fast.pace.timed_read(64, 0.001)
    fast.pace.timed_compute(64, 0.064)
    assert reply(third) == (cold, 592) and fast.pace.read_seconds != 0.001 / 64  # (and this read was timed)


def test_the_budget_removes_the_least_recently_used_blocks(tmp_path):
    blocks = {f"{n:040x}": block_payload([n] * 16, [bytes(1000)]) for n in range(6)}
    size = 1000 + 4 + 64 + 56  # a frame: its payload (ids and bytes), head and checksum
    tier = DiskTier(tmp_path, 4 * size)
    for n, (key, data) in enumerate(blocks.items()):
        tier.put(key, data)
        tier.drain()
        if n == 2:
            assert tier.read(f"{0:040x}") is not None  # block 0 used again: 1 is the oldest now
    kept = {key for key in blocks if tier.read(key) is not None}
    assert kept == {f"{n:040x}" for n in (0, 3, 4, 5)} and tier.bytes <= 4 * size
    reopened = DiskTier(tmp_path, 2 * size)  # a smaller budget, the next process: the oldest go
    assert {key for key in blocks if reopened.read(key) is not None} == {f"{n:040x}" for n in (4, 5)}


def test_sigkill_while_blocks_are_written_leaves_no_half_block(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "disk_tier_kill_helper.py"), str(tmp_path), "12"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert len(found["killed"]) >= 30 and found["half_written"] >= 10, found
    assert found["problems"] == []


FULL_DISK = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # no block file fits: as a full disk
sys.path.insert(0, sys.argv[2])
from test_kv_disk_tier import engine, leave_memory, reply
from pathlib import Path
one = engine(Path(sys.argv[1]))
print(reply(one)[0]); leave_memory(one)
two = engine(Path(sys.argv[1]))
print(reply(two)[0]); leave_memory(two)
"""


def test_a_full_disk_stops_the_writing_says_so_once_and_replies_go_on(tmp_path):
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path), str(ROOT / "tests")], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == second and first.startswith("[")
    assert done.stderr.count("the KV disk tier stops writing") == 1, done.stderr
    assert not list(tmp_path.rglob("*.tmp")) and not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_mlxchat_sessions_disk_kv_shows_and_clears_the_tier(tmp_path):
    tier = DiskTier(tmp_path / "kv-disk", 1 << 30)
    for n in range(3):
        tier.put(f"{n:040x}", block_payload([n] * 16, [bytes(100)]))
    tier.drain()
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLXCHAT_HOME=str(tmp_path))

    def sessions(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "app.cli", "sessions", "disk-kv", *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout
    assert "3 KV blocks" in sessions()
    assert "Removed 3 KV blocks" in sessions("--clear")
    assert "0 KV blocks" in sessions()


def test_a_second_ask_reads_the_first_ones_long_prompt_from_disk(tmp_path):
    """Two `mlxchat ask` processes, the same long prompt: the second reads it back (all but the last block)."""
    prompt = " ".join(f"Rule {i}: keep the answer short and polite." for i in range(60)) + " Which rule is first?"
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLXCHAT_HOME=str(tmp_path), HF_HUB_OFFLINE="1")

    def ask() -> dict:
        done = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--model", "mini-target", "--no-draft",
                               "--max-tokens", "4", "--json", "-"], input=prompt, env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])
    first, second = ask(), ask()
    stats = second["stats"]
    assert first["stats"]["reused_tokens"] == 0 and first["text"] == second["text"]
    assert stats["reused_tokens"] >= stats["prompt_tokens"] - 16 - 1, stats


CHAT = """
import json, sys
from mlxcore import GenerationParams, KVConfig, ModelChoice, open_engine
from sessions import ChatSession
engine = open_engine(ModelChoice(model="mini-target", no_draft=True),
                     KVConfig(disk_kv_bytes=1 << 30, disk_kv_dir=sys.argv[1])).engine
chat = ChatSession(engine, " ".join(f"Rule {i}: keep the answer short." for i in range(60)),
                   GenerationParams(temperature=0, max_tokens=6))
turns = [(str(chat.send(text)), chat.last_stats) for text in ("Which rule is first?", "And the last?")]
print(json.dumps([(text, stats.reused_tokens, stats.disk_reused_tokens, stats.prompt_tokens) for text, stats in turns]))
"""  # the program ends with its chat still open: nothing here asks for the blocks to go to disk


def test_a_chat_session_programs_blocks_reach_the_disk_when_it_ends(tmp_path):
    def program() -> list:
        done = subprocess.run([sys.executable, "-c", CHAT, str(tmp_path)], capture_output=True, text=True,
                              timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1"))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])
    first, again = program(), program()
    assert [text for text, *_ in first] == [text for text, *_ in again]  # the same replies
    (_, reused, from_disk, prompt), (_, _, second_turn_from_disk, _) = again
    assert first[0][1] == 0 and reused == from_disk >= prompt - 16 - 1  # the held chat's blocks, back from disk
    assert second_turn_from_disk == 0  # the next turn finds its chat in memory: no stale count

"""One model on two ring ranks over 127.0.0.1, started as users start it (``mlx.launch -- mlxchat ...``), or
each rank as mlx.launch starts it, without its I/O loop, which spins (``ranks.start_ranks``).

Greedy replies must be the tokens one process gives, turn after turn of a saved
session (each turn a new launch, so every turn after the first restores the KV
the 2-rank run saved), with and without the draft, on the embedded pair and on a
tiny random-weight Qwen3-MoE; and a Python script under ``mlx.launch``. The
faults, and ``serve`` on two ranks: test_distributed_faults.py.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from process_watch import HANG_S
from ranks import EMBEDDED, ENV, MLX_LAUNCH, ROOT, TURNS, ask, free_ports, tiny_moe_folder
from sessions.file_format import read_header

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_process_turns(tmp_path_factory):
    """TURNS in one process without a draft, once per target and cache kind: the tokens every rank count and
    draft setting must give (speculative greedy output is plain greedy output)."""
    done: dict[tuple, tuple[list[tuple[list[int], dict]], int]] = {}

    def turns(model: tuple[str, ...], kv: tuple[str, ...]) -> tuple[list[tuple[list[int], dict]], int]:
        """Each turn's (tokens, stats), and the KV heads its session file holds."""
        target = model[:model.index("--model") + 2]
        if (target, kv) not in done:
            session = tmp_path_factory.mktemp("one-process") / "one.json"
            replies = [ask(session, prompt, (*target, "--no-draft"), ranks=1, kv=kv) for prompt in TURNS]
            done[target, kv] = replies, read_header(session)["cache"]["target"]["kv_heads"]
        return done[target, kv]
    return turns


def turns_as_one_process(tmp_path: Path, reference, model: tuple[str, ...], kv: tuple[str, ...] = ("--kv", "paged"),
                         turns: int = 2, mlx_launch: bool = False) -> None:
    """``turns`` turns on 2 ranks, each a new launch continuing the session file (the second restores the KV
    the first saved): the tokens one process gives."""
    sharded, (replies, kv_heads) = tmp_path / "two-ranks.json", reference(model, kv)
    for turn, (prompt, (expected, single_stats)) in enumerate(zip(TURNS[:turns], replies)):
        tokens, stats = ask(sharded, prompt, model, ranks=2, kv=kv, mlx_launch=mlx_launch)
        assert tokens == expected, f"turn {turn + 1}"
        assert stats["world_size"] == 2 and len(stats["rank_weight_bytes"]) == 2
        assert stats["prompt_tokens"] == single_stats["prompt_tokens"]
        if turn:  # the KV saved by the last 2-rank run was restored and used, as in one process
            assert stats["reused_tokens"] == single_stats["reused_tokens"] > 0
    # one file for every rank count: it holds all the target's KV heads, not rank 0's half
    assert read_header(sharded)["cache"]["target"]["kv_heads"] == kv_heads >= 2


@pytest.mark.parametrize("pair", sorted(EMBEDDED))
def test_two_ranks_answer_as_one_process(tmp_path, one_process_turns, pair):
    """With the draft, under mlx.launch as README shows it."""
    turns_as_one_process(tmp_path, one_process_turns, EMBEDDED[pair], mlx_launch=pair == "draft")


def test_two_ranks_answer_as_one_process_rotating(tmp_path, one_process_turns):
    """A window smaller than the conversation: by turn 3 the oldest tokens are gone on every rank alike."""
    turns_as_one_process(tmp_path, one_process_turns, EMBEDDED["draft"], kv=("--kv", "rotating", "--max-kv", "64"),
                         turns=3)


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory) -> Path:
    return tiny_moe_folder(tmp_path_factory.mktemp("moe"))


@pytest.mark.parametrize("draft", [("--no-draft",), ("--draft", "mini-draft")])
def test_two_ranks_answer_as_one_process_moe(tmp_path, one_process_turns, moe_folder, draft):
    """The MoE target splits its experts' widths over the ranks; the embedded draft shares its tokenizer."""
    turns_as_one_process(tmp_path, one_process_turns, ("--model", str(moe_folder), *draft))


@pytest.mark.parametrize("saved_on, opened_on", [(2, 1), (1, 2)])
def test_a_file_opens_on_another_rank_count(tmp_path, one_process_turns, saved_on, opened_on):
    """Files hold every KV head: one saved on 2 ranks continues in one process, and the other way round."""
    model, moved = EMBEDDED["draft"], tmp_path / "moved.json"
    for prompt in TURNS[:2]:
        ask(moved, prompt, model, ranks=saved_on)
    tokens, stats = ask(moved, TURNS[2], model, ranks=opened_on)
    expected, _ = one_process_turns(model, ("--kv", "paged"))[0][2]
    assert tokens == expected and stats["reused_tokens"] > 0 and stats["world_size"] == opened_on


@pytest.fixture(scope="module")
def hybrid_folder(tmp_path_factory) -> Path:
    from assets import MODELS_DIR
    from tiny_models import tiny_hybrid, tiny_hybrid_config, write_model_folder

    return write_model_folder(tiny_hybrid(), tmp_path_factory.mktemp("hybrid") / "tiny-hybrid",
                              MODELS_DIR / "mini-target", config=tiny_hybrid_config())


def test_two_ranks_answer_as_one_process_hybrid(tmp_path, one_process_turns, hybrid_folder):
    """A tiny Qwen3.5 split by mlx-lm's ``shard()`` (its linear heads and convolution channels too): each turn
    a new launch continuing the session file, whose linear states hold every rank's heads."""
    turns_as_one_process(tmp_path, one_process_turns, ("--model", str(hybrid_folder), "--no-draft"),
                         kv=("--kv", "standard"))


def test_a_hybrid_file_saved_on_two_ranks_goes_on_in_one_process(tmp_path, one_process_turns, hybrid_folder):
    model, kv, moved = ("--model", str(hybrid_folder), "--no-draft"), ("--kv", "standard"), tmp_path / "moved.json"
    for prompt in TURNS[:2]:
        ask(moved, prompt, model, ranks=2, kv=kv)
    tokens, stats = ask(moved, TURNS[2], model, ranks=1, kv=kv)
    expected, single = one_process_turns(model, kv)[0][2]
    assert tokens == expected and stats["reused_tokens"] == single["reused_tokens"] > 0


SCRIPT = """
import mlxcore
from mlxcore import open_engine
from sessions import ChatSession
from mlxcore.params import GenerationParams

engine = open_engine("mini-target").engine
session = ChatSession(engine, params=GenerationParams(temperature=0.0, max_tokens=24))
replies = [session.send(prompt) for prompt in {turns!r}]
if engine.world.leader:
    print(repr((engine.world.size, replies)))
"""


def test_a_python_script_under_mlx_launch(tmp_path):
    """README's Python API over ranks: the same calls on every rank, rank 0 prints; one process's replies."""
    script = tmp_path / "chat.py"
    script.write_text(SCRIPT.format(turns=list(TURNS)))
    split = subprocess.run([str(MLX_LAUNCH), "-n", "2", "--backend", "ring", "-p", str(free_ports(2)), "--",
                            sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S,
                           env=ENV)
    alone = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S,
                           env=ENV)
    (size, replies), (one, expected) = ast.literal_eval(split.stdout.strip()), ast.literal_eval(alone.stdout.strip())
    assert (size, one) == (2, 1) and replies == expected and all(replies), split.stderr

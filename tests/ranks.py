"""Starting mlxchat on several ring ranks over 127.0.0.1: as users do (``mlx.launch``), each rank as mlx.launch starts
it (``start_ranks``), or one process at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from assets import MODELS_DIR
from mlxcore.distributed.ports import free_ports, local_hostfile
from process_watch import HANG_S
from tiny_models import tiny_moe_config, tiny_qwen3_moe, write_model_folder

ROOT = Path(__file__).resolve().parent.parent
MLX_LAUNCH = Path(sys.executable).parent / "mlx.launch"
ENV = dict(os.environ, HF_HUB_OFFLINE="1")


def mlxchat(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", *args]


def launch(args: list[str], ranks: int = 2, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    """``mlx.launch -n RANKS --backend ring -- mlxchat ARGS``: every rank's output, merged as mlx.launch merges it."""
    command = [str(MLX_LAUNCH), "-n", str(ranks), "--backend", "ring", "-p", str(free_ports(ranks)), "--",
               *mlxchat(*args)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)


def start_ranks(args: list[str], ranks: int, folder: Path) -> subprocess.CompletedProcess:
    """``ranks`` processes started as ``mlx.launch`` starts them on this machine (each its ``MLX_RANK`` and the
    ring's host file), without its I/O loop: that loop spins a core per rank, which on this 2-core host doubles
    a 2-rank run (docs/several_machines.md). Every rank's output, rank 0's first."""
    hosts = hostfile(folder, ranks)
    every = [start_rank(rank, hosts, args) for rank in range(ranks)]
    try:
        with ThreadPoolExecutor(ranks) as readers:  # every rank's pipes read at once: none fills and blocks
            outputs = list(readers.map(lambda rank: rank.communicate(timeout=HANG_S), every))
    finally:
        for rank in every:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    failed = [rank.returncode for rank in every if rank.returncode]
    return subprocess.CompletedProcess(args, failed[0] if failed else 0, "".join(out for out, _ in outputs),
                                       "".join(err for _, err in outputs))


def one_process(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(mlxchat(*args), cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, env=ENV)


def hostfile(folder: Path, ranks: int) -> Path:
    """A ring host file for ``ranks`` processes on 127.0.0.1 (what mlx.launch writes for each rank)."""
    return local_hostfile(folder / "hosts.json", ranks)


def start_rank(rank: int, hosts: Path, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """One rank, started by hand as mlx.launch would (so a test can kill it and watch the others)."""
    env = dict(ENV, MLX_RANK=str(rank), MLX_HOSTFILE=str(hosts), **(env or {}))
    return subprocess.Popen(mlxchat(*args), cwd=ROOT, env=env, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def json_reply(stdout: str) -> tuple[list[int], dict]:
    """(token ids, final stats) from ``ask --json`` output."""
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    tokens = [r["token"] for r in records if r["type"] == "token"]
    finals = [r for r in records if r["type"] == "final"]
    assert len(finals) == 1, f"one final record expected, got {len(finals)}: {stdout[-2000:]}"
    return tokens, finals[0]["stats"]


# The embedded pair, greedy, as the rank tests ask it (tests/test_distributed*.py).
TOKENIZER_SOURCE = MODELS_DIR / "mini-target"
TURNS = ("What is 12 + 7?", "And 3 + 4?", "Name a colour.")
GREEDY = ("--json", "--temp", "0", "--max-tokens", "24")
EMBEDDED = {"draft": ("--model", "mini-target", "--draft", "mini-draft", "--num-draft", "4"),
            "no-draft": ("--model", "mini-target", "--no-draft")}


def ask(session: Path, prompt: str, model: tuple[str, ...], ranks: int, kv: tuple[str, ...] = ("--kv", "paged"),
        mlx_launch: bool = False) -> tuple[list[int], dict]:
    """One greedy ``ask`` turn on ``ranks`` ranks: under ``mlx.launch`` as users start it (``mlx_launch``), else
    each rank started as it would start them."""
    args = ["ask", prompt, "--session", str(session), *GREEDY, *kv, *model]
    if ranks == 1:
        done = one_process(args)
    elif mlx_launch:
        done = launch(args, ranks)
    else:
        done = start_ranks(args, ranks, session.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json_reply(done.stdout)


def tiny_moe_folder(parent: Path) -> Path:
    """A tiny random-weight Qwen3-MoE on the embedded tokenizer: its experts' widths split over ranks."""
    return write_model_folder(tiny_qwen3_moe(3), parent / "tiny-moe", TOKENIZER_SOURCE, config=tiny_moe_config())

"""Two ring ranks over 127.0.0.1 when something goes wrong, and ``serve`` on two ranks.

A rank killed mid-reply, an idle server whose rank dies, ctrl+c on every rank, a
rank that stops answering, a rank count that does not divide the KV heads, a rank
with another model, commands that run in one process only. The answers on two
ranks: test_distributed.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from process_watch import HANG_S, seconds_until_gone
from ranks import (EMBEDDED, ENV, MLX_LAUNCH, ROOT, TOKENIZER_SOURCE, TURNS, ask, free_ports, hostfile, launch,
                   mlxchat, start_rank, tiny_moe_folder)
from serve_process import ServeProcess, free_port, http, poll_until
from sessions.file_format import read_header
from tiny_models import tiny_config, tiny_qwen3, write_model_folder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory) -> Path:
    return tiny_moe_folder(tmp_path_factory.mktemp("moe"))


STORY = ["ask", "Tell me a story.", "--json", "--temp", "0", "--max-tokens", "100000", "--no-think"]


def stderr_after(fault, ranks: list[subprocess.Popen], survivor: int, limit: float) -> str:
    """Run ``fault()`` on running ``ranks``; rank ``survivor`` must then exit within ``limit`` s: its stderr."""
    try:
        fault()
        took = seconds_until_gone(ranks[survivor].pid, limit=limit)
        assert took is not None, f"rank {survivor} did not stop within {limit} s"
        return ranks[survivor].communicate(timeout=HANG_S)[1]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()


def mid_reply(ranks: list[subprocess.Popen]) -> None:
    next(line for line in ranks[0].stdout if '"type": "token"' in line)


def serving(ranks: list[subprocess.Popen], port: int) -> None:
    poll_until(lambda: ranks[0].poll() is not None or _healthy(f"http://127.0.0.1:{port}"), every=0.1)


@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_rank_stops_the_other_with_a_message(tmp_path, moe_folder, killed):
    """Random weights never say EOS, so the second turn is still going when a rank is killed; the file keeps
    the first turn as it was."""
    session, model = tmp_path / "story.json", ("--model", str(moe_folder), "--no-draft")
    ask(session, "Begin a story.", model, ranks=2)  # turn 1, saved (24 tokens)
    saved = session.read_bytes()
    hosts = hostfile(tmp_path, 2)
    ranks = [start_rank(rank, hosts, [*STORY, "--session", str(session), *model]) for rank in range(2)]
    survivor = 1 - killed
    stderr = stderr_after(lambda: (mid_reply(ranks), ranks[killed].kill()), ranks, survivor, limit=10)
    assert ranks[survivor].returncode == 1
    assert f"rank {survivor} of 2: another rank of this run stopped" in stderr and "Traceback" not in stderr, stderr
    assert session.read_bytes() == saved, "a reply cut short by a lost rank is not saved, and nothing is lost"
    tokens, stats = ask(session, "Go on.", model, ranks=1)  # the file still serves the next turn
    assert tokens and stats["reused_tokens"] > 0


def test_an_idle_server_stops_when_a_rank_dies(tmp_path):
    """No request in flight: rank 0's heartbeat finds the dead rank, and the server stops with a message."""
    hosts, port = hostfile(tmp_path, 2), free_port()
    ranks = [start_rank(rank, hosts, ["serve", "--port", str(port), *EMBEDDED["no-draft"]]) for rank in range(2)]
    stderr = stderr_after(lambda: (serving(ranks, port), ranks[1].kill()), ranks, 0, limit=10)
    assert ranks[0].returncode == 1
    assert "rank 0 of 2: another rank of this run stopped" in stderr and "Traceback" not in stderr, stderr


def test_ctrl_c_stops_every_rank_at_the_same_token_and_keeps_the_turn(tmp_path, moe_folder):
    """As from a terminal: SIGINT to both ranks mid-reply. Rank 0 decides, both stop together, the turn is saved
    (as one process saves it) and goes on in one process from the cache it left."""
    session = tmp_path / "story.json"
    hosts = hostfile(tmp_path, 2)
    ranks = [start_rank(rank, hosts, [*STORY, "--session", str(session), "--model", str(moe_folder), "--no-draft"])
             for rank in range(2)]
    try:
        mid_reply(ranks)
        for rank in ranks:
            rank.send_signal(signal.SIGINT)
        outputs = [rank.communicate(timeout=HANG_S) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert [rank.returncode for rank in ranks] == [130, 130], outputs
    assert "mlxchat: interrupted" in outputs[0][1] and "interrupted" not in outputs[1][1]
    history = read_header(session)["history"]
    assert [m["role"] for m in history] == ["user", "assistant"] and history[1]["content"]
    tokens, stats = ask(session, "And then?", ("--model", str(moe_folder), "--no-draft"), ranks=1)
    assert tokens and stats["reused_tokens"] > 0


@pytest.mark.parametrize("command", ["ask", "serve"])
def test_a_silent_rank_stops_the_other(tmp_path, moe_folder, command):
    """Rank 1 stops answering without dying (SIGSTOP: a Mac asleep): rank 0 stops after the stall limit."""
    hosts, port = hostfile(tmp_path, 2), free_port()
    args = [*(STORY if command == "ask" else ["serve", "--port", str(port)]), "--model", str(moe_folder),
            "--no-draft"]
    ranks = [start_rank(rank, hosts, args, env={"MLXCHAT_RANK_STALL_S": "3"}) for rank in range(2)]
    started = (lambda: mid_reply(ranks)) if command == "ask" else (lambda: serving(ranks, port))
    stderr = stderr_after(lambda: (started(), ranks[1].send_signal(signal.SIGSTOP)), ranks, 0, limit=15)
    assert ranks[0].returncode == 1
    assert "rank 0 of 2: no progress for" in stderr and "another rank stopped answering" in stderr, stderr


def write_tiny(folder: Path, **config) -> Path:
    return write_model_folder(tiny_qwen3(0, **config), folder, TOKENIZER_SOURCE,
                              config=tiny_config(vocab_size=2048, **config))


def exit_codes(done: subprocess.CompletedProcess) -> list[str]:
    """mlx.launch exits 0 whatever its ranks do; it reports each rank that failed on stderr."""
    return sorted(re.findall(r"rank (\d+) exited with code (\d+)", done.stderr))


def test_kv_heads_that_do_not_divide_stop_before_weights_load(tmp_path, monkeypatch):
    folder = write_tiny(tmp_path / "three-kv-heads", heads=6, kv_heads=3)
    done = launch(["ask", "hi", "--model", str(folder), "--no-draft"], ranks=2)
    assert ("0", "2") in exit_codes(done), done.stderr
    assert "has 3 KV heads, which 2 ranks cannot share evenly" in done.stderr
    assert "(e.g. 1)" in done.stderr and "Traceback" not in done.stderr
    # the check comes before the weights are read (here in one process, told it is one of 2 ranks)
    from mlxcore import loading
    from mlxcore.distributed.errors import ShardingError
    from mlxcore.distributed.world import World

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded")
    monkeypatch.setattr(loading, "_build_model", no_weights)
    with pytest.raises(ShardingError, match="3 KV heads"):
        loading.load_found(loading.find_model(str(folder)), world=World(size=2, rank=1))


def test_a_rank_with_another_model_is_named(tmp_path):
    first = write_tiny(tmp_path / "same-name")
    other = write_model_folder(tiny_qwen3(1, vocab_size=2048), tmp_path / "other" / "same-name", TOKENIZER_SOURCE,
                               config=tiny_config(vocab_size=2048))
    hosts = hostfile(tmp_path, 2)
    ranks = [start_rank(rank, hosts, ["ask", "hi", "--no-draft", "--model", str(folder)])
             for rank, folder in enumerate((first, other))]
    outputs = [rank.communicate(timeout=HANG_S) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [2, 2], outputs
    stderr = outputs[0][1]
    assert "rank 1 has" in stderr and "where rank 0 has" in stderr, stderr
    assert "Traceback" not in stderr + outputs[1][1]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_serve_on_two_ranks(tmp_path, family):
    """rank 0 serves HTTP: the openai client gets one process's greedy replies (three at once, batched);
    /metrics shows both ranks; ctrl+c stops every rank. The embedded pair, and a tiny Qwen3.5 (hybrid layers,
    standard caches, its replies batched whole)."""
    model, name = EMBEDDED["draft"], "mini-target"
    if family == "qwen3_5":
        from tiny_models import tiny_hybrid, tiny_hybrid_config
        folder = write_model_folder(tiny_hybrid(), tmp_path / "tiny-hybrid", TOKENIZER_SOURCE,
                                    config=tiny_hybrid_config())
        model, name = ("--model", str(folder)), "tiny-hybrid"
    port = free_port()
    command = [str(MLX_LAUNCH), "-n", "2", "--backend", "ring", "-p", str(free_ports(2)), "--",
               *mlxchat("serve", "--port", str(port), *model)]
    log = tmp_path / "serve.log"
    # stdin a pipe that stays open and silent, as a terminal nobody types in: on a stdin at end of file
    # mlx.launch's main thread queues an empty read for its ranks all the time, and a ctrl+c landing inside
    # Queue.put leaves that queue's lock held, so the thread of a rank that exits waits on it for ever
    with open(log, "wb") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=dict(ENV, MLXCHAT_HOME=str(tmp_path / "home")),
                                  stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        poll_until(lambda: server.poll() is not None or _healthy(url), every=0.1)
        assert server.poll() is None, log.read_text()
        reply = _chat(url, name)
        status, _, metrics = http("GET", f"{url}/metrics")
        saved, _, _ = http("POST", f"{url}/v1/sessions/kept/save", {"messages": [{"role": "user", "content": "hi"}]})
    finally:  # ctrl+c, as a terminal sends it: to mlx.launch and both ranks
        os.killpg(server.pid, signal.SIGINT)
        # the grace for replies in flight, uvicorn's shutdown, then both ranks' exits, on cores other test
        # processes share (30 s, then 60 s, were each once not enough while the whole suite ran; mlx.launch
        # spins a core per rank)
        stopped = seconds_until_gone(server.pid, limit=120)
        left = "" if stopped is not None else subprocess.run(
            ["ps", "-o", "pid,stat,etime,args", "-g", str(server.pid)], capture_output=True, text=True).stdout
        if stopped is None:
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=HANG_S)
        server.stdin.close()
    assert stopped is not None, f"{log.read_text()}\nstill running after 120 s:\n{left}"
    poll_until(lambda: _group_gone(server.pid), limit=30)  # no rank left behind
    (tmp_path / "single").mkdir()
    with ServeProcess(tmp_path / "single", pair=model) as single:
        expected = _chat(single.url, name)
    assert reply == expected, (reply, expected)
    assert all(r["content"] for r in reply)
    assert status == 200 and "mlxchat_world_size 2.0" in metrics, metrics
    assert 'mlxchat_rank_weight_bytes{rank="1"}' in metrics
    assert saved == 501
    # mlx.launch prints its own KeyboardInterrupt traceback on ctrl+c; no mlxchat code may be in one
    assert not re.search(r'File "[^"]*/(app|mlxcore|sessions)/', log.read_text()), log.read_text()


def _chat(url: str, model: str) -> list[dict]:
    """The replies to TURNS, asked at once (the scheduler batches them)."""
    import openai
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)

    def ask(prompt: str) -> dict:
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                               temperature=0, max_tokens=64)
        return reply.choices[0].message.model_dump()
    with ThreadPoolExecutor(len(TURNS)) as pool:
        return list(pool.map(ask, TURNS))


def _group_gone(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


def _healthy(url: str) -> bool:
    try:
        return http("GET", f"{url}/health", timeout=2)[0] == 200
    except OSError:
        return False


@pytest.mark.parametrize("command", [[], ["sessions", "ls"]])
def test_one_process_commands_refuse_ranks(command):
    done = launch([*command], ranks=2)
    assert ("0", "2") in exit_codes(done), done.stderr
    assert "runs in one process; over several ranks (mlx.launch) run `mlxchat serve`" in done.stderr
    assert "Traceback" not in done.stderr

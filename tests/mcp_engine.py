"""The window's engine process with scripted replies (``scripted_model``), for the window's MCP tests.

``scripted_engine_process`` stands in for ``app.tui.engine_client.run_engine_process`` (a test patches it
there; 'spawn' then starts this module's function in the child): the batch runner's replies follow the
rules, a JSON list of [needle, reply], in the file named by ``MLXCHAT_TEST_SCRIPT``, then the engine host
serves the window as usual. The embedded pair calls only its three demo tools (``test_tui_demo_tools``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlxcore  # noqa: F401  (before mlx.core: it picks the BLAS)


def use_script(tmp_path: Path, monkeypatch, rules: list) -> None:
    """The window's engine answers by ``rules`` ([needle, reply] pairs) and keeps its store under ``tmp_path``."""
    monkeypatch.setenv("MLXCHAT_HOME", str(tmp_path / "home"))
    script = tmp_path / "script.json"
    script.write_text(json.dumps(rules))
    monkeypatch.setenv("MLXCHAT_TEST_SCRIPT", str(script))


def scripted_engine_process(conn, log_path: str) -> None:
    from app.tui.engine_client import run_engine_process
    from mlxcore.batching.runner import BatchRunner
    from scripted_model import USER, ScriptedReply

    rules = [tuple(rule) for rule in json.loads(Path(os.environ["MLXCHAT_TEST_SCRIPT"]).read_text())]
    unscripted = BatchRunner._constraint

    def constraint(runner, request):
        tokenizer = runner.engine.tokenizer
        tail = tokenizer.decode(list(request.prompt_ids)).rsplit(USER, 1)[-1]
        reply = next((text for needle, text in rules if needle in tail), None)
        if reply is None:
            return unscripted(runner, request)
        script = list(tokenizer.encode(reply, add_special_tokens=False))
        return ScriptedReply(script, min(runner.engine.eos_ids), runner.engine.model.args.vocab_size)

    BatchRunner._constraint = constraint  # for the life of this process
    run_engine_process(conn, log_path)

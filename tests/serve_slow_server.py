"""`mlxchat serve` on a real BatchWorker whose steps are slowed down, and which can be made to fail.

The embedded models answer in a fraction of a second, too fast for a test to
act while a reply is under way (close the connection after 5 tokens, fail the
engine while two requests run). Here each scheduler step first waits
``MLXCHAT_TEST_STEP_SECONDS``, and each step that reads prompt tokens
``MLXCHAT_TEST_PROMPT_STEP_SECONDS`` (a long prompt's reading, deterministically:
with ``--step-tokens`` it takes a known number of steps); while the file ``MLXCHAT_TEST_FAULT_FILE`` exists,
steps raise, as a failing pass would (the worker's own handling then runs
unchanged); the first failing step removes the file if it holds "once". With
``MLXCHAT_TEST_IGNORE_EOS`` set, replies go on to their max_tokens (as the
window's bench does), since the embedded models' replies are short. Usage: python tests/serve_slow_server.py [serve options].
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import mlxcore  # noqa: F401  (before mlx.core: it picks the BLAS)

from app.cli import build_parser
from app.serve import command
from app.serve.command import real_worker, run_serve


class InjectedFault(RuntimeError):
    pass


def slow_worker(engine, args):
    if os.environ.get("MLXCHAT_TEST_IGNORE_EOS"):
        engine.eos_ids = set()
    worker = real_worker(engine, args)
    step, delay = worker.runner.step, float(os.environ.get("MLXCHAT_TEST_STEP_SECONDS", "0"))
    fault = os.environ.get("MLXCHAT_TEST_FAULT_FILE")

    def slow_step() -> None:
        if fault and Path(fault).exists():
            if Path(fault).read_text() == "once":
                Path(fault).unlink()
            raise InjectedFault("injected engine fault (tests/serve_slow_server.py)")
        time.sleep(delay)
        step()

    worker.runner.step = slow_step
    _slow_prompts(worker.runner.scheduler, float(os.environ.get("MLXCHAT_TEST_PROMPT_STEP_SECONDS", "0")))
    return worker


def _slow_prompts(scheduler, delay: float) -> None:
    """Each step whose plan reads prompt tokens first waits ``delay`` seconds."""
    plan = scheduler.plan

    def slow_plan(now: float):
        planned = plan(now)
        if planned.prefill:
            time.sleep(delay)
        return planned

    scheduler.plan = slow_plan


if __name__ == "__main__":
    command.real_worker = slow_worker  # every model's scheduler, for the life of this process
    sys.exit(run_serve(build_parser().parse_args(["serve", *sys.argv[1:]])))

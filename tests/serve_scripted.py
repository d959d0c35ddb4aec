"""`mlxchat serve` whose model's replies are scripted (``scripted_model``), for the tool-call tests.

The rules, a JSON list of [needle, reply], are read from the file named by
``MLXCHAT_TEST_SCRIPT``. Usage: python tests/serve_scripted.py [serve options].
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import mlxcore  # noqa: F401  (before mlx.core: it picks the BLAS)

from app.cli import build_parser
from app.serve import command
from app.serve.command import real_worker, run_serve
from scripted_model import scripted_model


SCRIPTS = []  # held: a context manager collected would end the script


def scripted_worker(engine, args):
    rules = [tuple(rule) for rule in json.loads(Path(os.environ["MLXCHAT_TEST_SCRIPT"]).read_text())]
    SCRIPTS.append(scripted_model(engine.tokenizer, min(engine.eos_ids), rules))
    SCRIPTS[-1].__enter__()  # for the life of the process
    return real_worker(engine, args)


if __name__ == "__main__":
    command.real_worker = scripted_worker  # every model's scheduler, for the life of this process
    sys.exit(run_serve(build_parser().parse_args(["serve", *sys.argv[1:]])))

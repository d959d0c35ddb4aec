"""`mlxchat serve` whose replies draft ``MLXCHAT_TEST_DRAFT_K`` tokens every round (``FixedDraftLength``), so that
a test sees speculative rounds whatever this host's timings (the engine's controller follows them).
Usage: python tests/serve_fixed_draft.py [serve options].
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import mlxcore  # noqa: F401  (before mlx.core: it picks the BLAS)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the bench's FixedDraftLength

from app.cli import build_parser  # noqa: E402
from app.serve import command  # noqa: E402
from app.serve.command import real_worker, run_serve  # noqa: E402
from bench.draft_lengths import FixedDraftLength  # noqa: E402


def fixed_worker(engine, args):
    engine.draft_control = FixedDraftLength(int(os.environ["MLXCHAT_TEST_DRAFT_K"]))
    return real_worker(engine, args)


if __name__ == "__main__":
    command.real_worker = fixed_worker
    sys.exit(run_serve(build_parser().parse_args(["serve", *sys.argv[1:]])))

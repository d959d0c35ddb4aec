"""The smoke runs of the bench's twin rows, plain and hybrid (``bench_smoke.py``): a file of its own, so that
the suite's workers share the groups."""

from __future__ import annotations

import pytest

from bench_smoke import run_smoke
from twin_fixtures import twins_root  # noqa: F401


@pytest.mark.slow
@pytest.mark.parametrize("group", ["twins", "hybrid_twins"])
def test_every_row_runs_at_its_smallest_setting(group, twins_root, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MLXCHAT_TWINS", str(twins_root))  # the run's twins, built once for every test
    run_smoke(group)

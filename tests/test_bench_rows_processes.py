"""The smoke runs of the bench's server, window and several-process rows (``bench_smoke.py``): a file of its own, so that the suite's
workers share the groups."""

from __future__ import annotations

import pytest

from bench_smoke import run_smoke


@pytest.mark.slow
@pytest.mark.parametrize("group", ["processes"])
def test_every_row_runs_at_its_smallest_setting(group):
    run_smoke(group)

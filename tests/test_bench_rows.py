"""Every bench row runs, at its smallest setting (`BenchSetup.smoke`), so no row can break unseen: a row
stopped every `mlxchat bench` for days once (store_list_seconds, after caches came to need their ids) and
no test ran it. Rows are grouped by what they load, one test a group; a row added to the bench without a
place in ``bench_smoke.py`` fails `test_every_row_has_a_smoke_run` until it is given one (the groups' runs are
spread over ``test_bench_rows*.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.command import all_rows
from bench.groups import DEFAULT_ROWS, EXPECTED_SECONDS
from bench.runner import RAISE_ENV
from bench_smoke import SMOKE_GROUPS, run_smoke
from twin_fixtures import twins_root  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def test_every_row_has_a_smoke_run_and_an_expected_time():
    grouped = [name for names in SMOKE_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(set(grouped)), "a row is in two smoke groups"
    assert set(grouped) == set(all_rows()), f"rows without a smoke run: {set(all_rows()) - set(grouped)}"
    assert set(EXPECTED_SECONDS) == set(all_rows()), "every row says how long it takes (bench/groups.py)"
    assert set(DEFAULT_ROWS) <= set(all_rows())


@pytest.mark.slow
@pytest.mark.parametrize("group", ["embedded", "sessions"])
def test_every_row_runs_at_its_smallest_setting(group, twins_root, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MLXCHAT_TWINS", str(twins_root))  # (rows that build a twin build it once for the run)
    run_smoke(group)


def test_a_failing_row_leaves_the_others_in_the_json_and_exit_status_1(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{RAISE_ENV: "paged_kv_overhead"})
    done = subprocess.run([sys.executable, "-m", "app.cli", "bench", "--smoke", "--json", str(out),
                           "--only", "paged_kv_overhead,kv8_bytes_ratio,paged_branch_memory"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert list(rows) == ["paged_kv_overhead", "kv8_bytes_ratio", "paged_branch_memory"]
    assert rows["paged_kv_overhead"]["error"] == f"RuntimeError: made to raise by {RAISE_ENV}"
    assert rows["kv8_bytes_ratio"]["value"] > 0 and rows["paged_branch_memory"]["value"] > 0
    assert "FAILED" in done.stdout and "1 of 3 rows failed: paged_kv_overhead" in done.stderr
    machine = report["machine"]
    assert machine["mlx"] and machine["mlx_lm"] and machine["memory_bytes"] > 0 and machine["chip"]
    assert report["setup"]["model"] == "mini-target" and report["setup"]["draft"] == "mini-draft"


def test_the_help_names_only_what_a_user_has(capsys):
    from app.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    shown = capsys.readouterr().out
    assert "--all" in shown and "--json" in shown
    assert "DESIGN" not in shown and ".md" not in shown

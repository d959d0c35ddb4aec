"""The bench's rows find the files they read and start their probes from the project's root (bench/ moved
out of mlxcore/ once, and two rows kept looking one folder too high)."""

from __future__ import annotations

from pathlib import Path

from bench import kv_quant, tensor_parallel

ROOT = Path(__file__).resolve().parents[1]


def test_kv_quant_reads_the_projects_readme():
    assert kv_quant.TEXT == ROOT / "README.md" and kv_quant.TEXT.is_file()


def test_the_tensor_parallel_probe_starts_where_bench_is_a_package():
    assert tensor_parallel.ROOT == ROOT and (tensor_parallel.ROOT / "bench" / "tp_probe.py").is_file()

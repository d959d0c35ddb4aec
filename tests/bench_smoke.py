"""The bench's rows grouped by what they load, and a group's smoke run (``BenchSetup.smoke``): one test file a
few groups (``test_bench_rows*.py``), so that the suite's workers share them."""

from __future__ import annotations

from bench.command import all_rows
from bench.runner import BenchSetup, run_rows

SMOKE_GROUPS = {  # what each group loads; the groups together hold every row
    "embedded": ("decode_vs_mlx_lm", "paged_kv_overhead", "paged_branch_memory", "paged_decode_vs_standard_long",
                 "pool_peak_vs_held", "spec_speedup_greedy", "spec_vs_mlx_lm_greedy", "accept_vs_mlx_lm_t06",
                 "spec_worst_case", "batch8_throughput_vs_single", "batch8_vs_mlx_lm", "join_stall_seconds",
                 "kv8_bytes_ratio", "kv4_bytes_ratio", "kv8_decode_vs_float_long", "kv8_prefill_peak_vs_float",
                 "kv8_accuracy", "kv4_accuracy", "spec_lone_vs_plain", "lookup_worst_case",
                 "block_draft_speedup_greedy"),
    "sessions": ("turn10_prefill_fraction", "turn10_prefill_fraction_long", "restore_ttft_vs_cold",
                 "autosave_write_ratio", "session_file_write_ratio", "store_list_seconds", "kv8_session_file_ratio",
                 "restart_ttft_vs_cold", "disk_tier_decode_cost"),
    "processes": ("blas_speedup", "tp2_decode_vs_single", "tui_decode_vs_headless", "serve1_vs_ask",
                  "serve8_throughput_vs_mlx_lm", "serve8_ttft_p99_vs_mlx_lm", "spec_batch2_vs_plain",
                  "spec_batch8_vs_plain", "block_draft_batch4_vs_plain", "lookup_batch4_vs_plain"),
    "twins": ("paged_decode_vs_standard_twin", "sampled_decode_vs_mlx_lm", "greedy_decode_vs_mlx_lm_twin",
              "twin_prefill_vs_mlx_lm", "prefill_steps_8k", "grammar_decode_vs_free", "grammar_mask_us",
              "grammar_spec_accept", "spec_batch2_vs_plain_twin", "spec_batch8_vs_plain_twin", "lookup_speedup_edit",
              "restart_ttft_vs_cold_twin"),
    "hybrid_twins": ("hybrid_decode_vs_mlx_lm", "hybrid_spec_vs_plain", "hybrid_turn10_prefill_fraction",
                     "hybrid_snapshot_bytes_per_token", "hybrid_batch_vs_alone",
                     "hybrid_request_turn10_prefill_fraction"),
}


def run_smoke(group: str) -> None:
    """Every row of ``group`` at its smallest setting: each gives a value, none an error."""
    results = run_rows(list(SMOKE_GROUPS[group]), BenchSetup(runs=1, smoke=True), rows=all_rows())
    failed = {name: result["error"] for name, result in results.items() if "error" in result}
    assert not failed, "\n".join(f"{name}: {error}" for name, error in failed.items())
    assert all("value" in result for result in results.values())

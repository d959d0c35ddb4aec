"""Which rows `mlxchat bench` runs by default, and how long each takes, to say before a run how long it will be.

The default rows are the headline figures (decode, speculative decoding, batching, the server, sessions):
about 5 minutes on an M-series Mac, under 20 on a 2-core x86 Linux host. `--all` adds the rest: the twins
of the 8B and 9B models and the long-context rows, hours on such a host.
"""

from __future__ import annotations

DEFAULT_ROWS = (
    "decode_vs_mlx_lm", "spec_speedup_greedy", "spec_vs_mlx_lm_greedy", "spec_worst_case",
    "batch8_throughput_vs_single", "batch8_vs_mlx_lm", "serve8_throughput_vs_mlx_lm", "serve8_ttft_p99_vs_mlx_lm",
    "spec_batch2_vs_plain", "spec_batch8_vs_plain", "lookup_worst_case", "block_draft_speedup_greedy",
    "turn10_prefill_fraction",
    "restore_ttft_vs_cold", "autosave_write_ratio", "store_list_seconds", "kv8_bytes_ratio",
)

# seconds each row takes at --runs 5 on a 2-core x86-64 Linux host (mlx[cpu], other work beside it), rounded up:
# the estimate printed before a run; runs scale the measuring part, not the loading. The default rows were
# measured (2026-11-29: 683 s of rows, 11 min 26 s in all); the others are estimates from docs/benchmarks.md.
# A row that shares another's runs (batch8_vs_mlx_lm, serve8_ttft_p99_vs_mlx_lm) costs nothing after it.
EXPECTED_SECONDS: dict[str, int] = {
    "decode_vs_mlx_lm": 25, "blas_speedup": 60, "paged_kv_overhead": 10, "paged_branch_memory": 10,
    "paged_decode_vs_standard_long": 60, "paged_decode_vs_standard_twin": 480, "pool_peak_vs_held": 40,
    "spec_speedup_greedy": 25, "spec_vs_mlx_lm_greedy": 30, "accept_vs_mlx_lm_t06": 40,
    "sampled_decode_vs_mlx_lm": 300, "greedy_decode_vs_mlx_lm_twin": 300, "hybrid_decode_vs_mlx_lm": 600,
    "twin_prefill_vs_mlx_lm": 600, "hybrid_spec_vs_plain": 900, "spec_worst_case": 60,
    "batch8_throughput_vs_single": 95, "batch8_vs_mlx_lm": 5, "join_stall_seconds": 60, "prefill_steps_8k": 1500,
    "kv8_bytes_ratio": 5, "kv4_bytes_ratio": 10, "kv8_decode_vs_float_long": 120, "kv8_prefill_peak_vs_float": 60,
    "kv8_accuracy": 120, "kv4_accuracy": 120, "spec_lone_vs_plain": 60, "grammar_decode_vs_free": 300,
    "grammar_mask_us": 60, "grammar_spec_accept": 120, "tp2_decode_vs_single": 120,
    "turn10_prefill_fraction": 20, "turn10_prefill_fraction_long": 120, "hybrid_turn10_prefill_fraction": 600,
    "hybrid_snapshot_bytes_per_token": 600, "hybrid_batch_vs_alone": 600,
    "hybrid_request_turn10_prefill_fraction": 600, "restore_ttft_vs_cold": 140, "autosave_write_ratio": 45,
    "session_file_write_ratio": 120, "store_list_seconds": 165, "kv8_session_file_ratio": 60,
    "tui_decode_vs_headless": 180, "serve1_vs_ask": 90, "serve8_throughput_vs_mlx_lm": 100,
    "serve8_ttft_p99_vs_mlx_lm": 5, "spec_batch2_vs_plain": 60, "spec_batch8_vs_plain": 90,
    "lookup_speedup_edit": 120, "lookup_worst_case": 40, "block_draft_speedup_greedy": 40,
    "block_draft_batch4_vs_plain": 90, "lookup_batch4_vs_plain": 90, "spec_batch2_vs_plain_twin": 900,
    "spec_batch8_vs_plain_twin": 1200, "restart_ttft_vs_cold": 60, "disk_tier_decode_cost": 60,
    "restart_ttft_vs_cold_twin": 700,
}


def expected_seconds(names: list[str], runs: int) -> float:
    """About how long these rows take on a 2-core x86 host: a third loading, two thirds scaling with runs."""
    return sum(EXPECTED_SECONDS.get(name, 60) * (1 + 2 * runs / 5) / 3 for name in names)

"""`mlxchat bench`: measure, print a table, optionally write JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.groups import DEFAULT_ROWS, expected_seconds
from bench.machine import machine_info
from bench.runner import ROWS, BenchSetup, Row, format_row, run_rows
from mlxcore.errors import UsageError


SMOKE_REPLY = {"reply_tokens": 4, "think_tokens": 2}  # a smoke run's replies in the rows of turns
SMOKE_TURNS = {"turns": 2, **SMOKE_REPLY}
SMOKE_STORE = {"chats": 2, "tokens": 64}
SMOKE_LOAD = {"concurrency": 2, "requests": 2, "max_tokens": 4}  # a smoke run's load on the two servers


def all_rows() -> dict[str, tuple[str, Row]]:
    """mlxcore's rows plus those of the layers above it (sessions, TUI, server)."""
    from bench.disk_tier import disk_tier_decode_cost, restart_ttft_vs_cold
    from bench.session_kv8 import kv8_session_file_ratio
    from bench.session_restore import restore_ttft_vs_cold
    from bench.session_file_write import session_file_write_ratio
    from bench.session_store import autosave_write_ratio, store_list_seconds
    from bench.session_turns import turn10_prefill_fraction, turn10_prefill_fraction_long
    from bench.hybrid_turns import hybrid_snapshot_bytes_per_token, hybrid_turn10_prefill_fraction
    from bench.hybrid_serving import hybrid_batch_vs_alone, hybrid_request_turn10_prefill_fraction
    from bench.tui import Workload, tui_decode_vs_headless
    from bench.twins import twin_folder

    smoke_tui = Workload(reply_tokens=16, earlier=4)
    from bench import serve as serve_bench
    from bench.spec_batch import TWIN_LOAD, spec_batch_vs_plain, spec_batch_vs_plain_twin
    from bench.lookup import lookup_speedup_edit, lookup_worst_case
    from bench.block_draft import block_draft_batch4_vs_plain, block_draft_speedup_greedy, lookup_batch4_vs_plain

    return ROWS | {
        "turn10_prefill_fraction": ("tokens prefilled at turn 10 / tokens of the whole templated conversation",
                                    lambda s: turn10_prefill_fraction(s.model, s.draft, max_tokens=s.pick(96, 8))),
        "turn10_prefill_fraction_long": ("the same with ~300-token replies: thinking off (value), and on ('on', "
                                         "at most 'on_bound': the last answer and the new message)",
                                         lambda s: turn10_prefill_fraction_long(s.model, **s.pick({}, SMOKE_REPLY))),
        "hybrid_turn10_prefill_fraction": ("turn10_prefill_fraction_long on the Qwen3.5-9B twin (60-token replies)",
                                           lambda s: hybrid_turn10_prefill_fraction(**s.pick({}, SMOKE_REPLY))),
        "hybrid_snapshot_bytes_per_token": ("bytes the linear states' snapshots hold / attention KV bytes, 6 turns "
                                            "on the Qwen3.5-9B twin",
                                            lambda s: hybrid_snapshot_bytes_per_token(**s.pick({}, SMOKE_TURNS))),
        "hybrid_batch_vs_alone": ("output tok/s of 4 requests side by side / one at a time, Qwen3.5-9B twin, greedy",
                                  lambda s: hybrid_batch_vs_alone(s.runs, *s.pick((4, 32), (2, 4)))),
        "hybrid_request_turn10_prefill_fraction": ("turn 10's prefilled / prompt tokens when every turn is a new request "
                                                   "with the whole history (as API clients send it), Qwen3.5-9B twin",
                                                   lambda s: hybrid_request_turn10_prefill_fraction(
                                                       **s.pick({}, {"turns": 3, **SMOKE_REPLY}))),
        "restore_ttft_vs_cold": ("first-token time after opening a stored 2,000+-token chat / cold re-prefill",
                                 lambda s: restore_ttft_vs_cold(s.model, s.draft, s.runs, min_tokens=s.pick(2000, 96))),
        "restart_ttft_vs_cold": ("first token of a 3,000-token conversation's next turn on an empty pool with the "
                                 "disk tier / without it (computed)",
                                 lambda s: restart_ttft_vs_cold(s.model, s.runs, tokens=s.pick(3000, 64))),
        "restart_ttft_vs_cold_twin": ("the same on the 8B twin (float32; one pair at --runs 5: a cold 3,000-token "
                                      "prompt takes minutes on a CPU)",
                                      lambda s: restart_ttft_vs_cold(str(twin_folder("qwen3-8b", bits=None)),
                                                                     s.pick(max(1, s.runs // 5), 1),
                                                                     tokens=s.pick(3000, 64))),
        "disk_tier_decode_cost": ("decode tok/s while evicted blocks are written to the disk tier / tier off",
                                  lambda s: disk_tier_decode_cost(s.model, s.runs, tokens=s.pick(256, 16))),
        "autosave_write_ratio": ("bytes an autosave writes after a short turn in a 3,000-token chat / the "
                                 "turn's new KV bytes (OS-counted)",
                                 lambda s: autosave_write_ratio(s.model, s.draft, s.runs, min_tokens=s.pick(3000, 96))),
        "session_file_write_ratio": ("bytes one more short `ask --session` turn writes to a 3,000-token chat's file "
                                     "/ the turn's new KV bytes (OS-counted)",
                                     lambda s: session_file_write_ratio(s.model, s.draft, s.runs,
                                                                        min_tokens=s.pick(3000, 96))),
        "store_list_seconds": ("seconds to list a store of 50 chats of 3,000 tokens",
                               lambda s: store_list_seconds(s.model, s.draft, s.runs, **s.pick({}, SMOKE_STORE))),
        "kv8_session_file_ratio": ("bytes of a session file of a 2,000-token chat, 8-bit KV / float KV",
                                   lambda s: kv8_session_file_ratio(s.model, s.draft, min_tokens=s.pick(2000, 96))),
        "tui_decode_vs_headless": ("decode tok/s while the TUI streams 2,000 tokens over 60 messages / headless",
                                   # twice the pairs: on 2 cores one pair's ratio spreads by +-10%
                                   lambda s: tui_decode_vs_headless(runs=s.pick(2 * s.runs, 1),
                                                                     workload=s.pick(Workload(), smoke_tui))),
        "serve1_vs_ask": ("decode tok/s of one streaming client of `mlxchat serve` / `mlxchat ask`, same prompt",
                          lambda s: serve_bench.serve1_vs_ask(s.model, s.runs, max_tokens=s.pick(512, 8))),
        "serve8_throughput_vs_mlx_lm": ("output tok/s, 8 streaming clients, `mlxchat serve` / `mlx_lm.server`",
                                        lambda s: serve_bench.serve8_throughput_vs_mlx_lm(
                                            s.model, s.runs, s.pick(serve_bench.LOAD, SMOKE_LOAD))),
        "serve8_ttft_p99_vs_mlx_lm": ("TTFT p99, 8 streaming clients, `mlxchat serve` / `mlx_lm.server`",
                                      lambda s: serve_bench.serve8_ttft_p99_vs_mlx_lm(
                                          s.model, s.runs, s.pick(serve_bench.LOAD, SMOKE_LOAD))),
        "spec_batch2_vs_plain": ("output tok/s, 2 streaming clients of `mlxchat serve`, with the draft / without "
                                 "(goal >= 1.5)",
                                 lambda s: spec_batch_vs_plain(s.model, s.draft, s.runs, 2, *s.pick((8, 128), (2, 4)))),
        "spec_batch8_vs_plain": ("the same with 8 clients (goal >= 1.0: never slower)",
                                 lambda s: spec_batch_vs_plain(s.model, s.draft, s.runs, 8, *s.pick((32, 128), (2, 4)))),
        "lookup_speedup_edit": ("decode tok/s with --draft lookup / plain: a reply writing out again a 1,500-token "
                                "text of its prompt with small changes, 0.6B twin geometry (goal >= 2.0)",
                                lambda s: lookup_speedup_edit(s.runs, *s.pick((1500, 256), (64, 8)))),
        "lookup_worst_case": ("decode tok/s with --draft lookup / plain, chat replies that repeat little "
                              "(goal >= 0.97)",
                              lambda s: lookup_worst_case(s.model, s.runs, s.pick(200, 8))),
        "block_draft_speedup_greedy": ("greedy decode tok/s with the embedded pair's trained block drafter "
                                       "(assets/models/mini-dflash) / plain; spec_speedup: the draft model's in "
                                       "the same run (goal >= 3.0)",
                                       lambda s: block_draft_speedup_greedy(s.model, s.draft, s.runs, s.pick(200, 8))),
        "block_draft_batch4_vs_plain": ("output tok/s, 4 streaming clients of `mlxchat serve`, with the block "
                                        "drafter / without",
                                        lambda s: block_draft_batch4_vs_plain(s.model, s.runs, *s.pick((16, 128),
                                                                                                       (2, 4)))),
        "lookup_batch4_vs_plain": ("output tok/s, 4 streaming clients of `mlxchat serve`, with --draft lookup / "
                                   "without",
                                   lambda s: lookup_batch4_vs_plain(s.model, s.runs, *s.pick((16, 128), (2, 4)))),
        "spec_batch2_vs_plain_twin": ("spec_batch2_vs_plain on the 8B twin, the 0.6B twin drafting (4-bit, random "
                                      "weights)",
                                      lambda s: spec_batch_vs_plain_twin(s.pick(max(2, s.runs // 2), 1), 2,
                                                                         *s.pick(tuple(TWIN_LOAD.values()), (2, 2)))),
        "spec_batch8_vs_plain_twin": ("the same with 8 clients",
                                      lambda s: spec_batch_vs_plain_twin(s.pick(max(2, s.runs // 2), 1), 8,
                                                                         *s.pick((8, 24), (2, 2)))),
    }


def run_bench(args: argparse.Namespace) -> int:
    """Run the chosen rows, print each as it ends and rewrite ``--json`` after each; 1 if a row failed."""
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    rows = all_rows()
    names = _chosen(args, rows)
    setup = BenchSetup(model=args.model or BenchSetup.model, draft=args.draft or BenchSetup.draft, runs=args.runs,
                       smoke=args.smoke)
    report = {"machine": machine_info(), "setup": setup.__dict__ | {"command": " ".join(sys.argv[1:])}, "rows": {}}
    if not setup.smoke:
        minutes = max(1.0, expected_seconds(names, setup.runs) / 60)
        print(f"{len(names)} rows, about {minutes:.0f} minutes on a 2-core x86 Linux host (an M-series Mac: about "
              f"a third of that); each row is printed as it ends", file=sys.stderr, flush=True)
    print(f"{'row':<24} {'value':>8}   what", flush=True)

    def ended(name: str, result: dict) -> None:
        report["rows"][name] = result
        print(format_row(name, rows[name][0], result), flush=True)
        if args.json:
            _write(Path(args.json), report)
        done = len(report["rows"])
        if done < len(names):
            print(f"[{done}/{len(names)}] next: {names[done]}", file=sys.stderr, flush=True)

    print(f"[0/{len(names)}] next: {names[0]}", file=sys.stderr, flush=True)
    run_rows(names, setup, ended, rows=rows)
    failed = [name for name, result in report["rows"].items() if "error" in result]
    if args.json:
        print(f"written to {args.json}", file=sys.stderr)
    if failed:
        print(f"mlxchat: {len(failed)} of {len(names)} rows failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _chosen(args: argparse.Namespace, rows: dict[str, tuple[str, Row]]) -> list[str]:
    """The rows to run: --only's, all with --all, else the default group; a typo is told before anything runs."""
    only = [name.strip() for value in args.only or [] for name in value.split(",") if name.strip()]
    unknown = [name for name in only if name not in rows]
    if unknown:
        raise UsageError(f"unknown bench row(s) {', '.join(unknown)}; rows: {', '.join(rows)}")
    if only and args.all:
        raise UsageError("give --only ROW or --all, not both")
    return only or (list(rows) if args.all else list(DEFAULT_ROWS))


def _write(path: Path, report: dict) -> None:
    """The whole report so far, replacing the file at once: a run stopped at any point leaves valid JSON."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    partial.replace(path)

"""`mlxchat bench`: measure, print a table, optionally write JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mlxcore.bench.runner import BenchSetup, format_row, run_rows
from mlxcore.errors import UsageError


def run_bench(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    setup = BenchSetup(model=args.model or BenchSetup.model, draft=args.draft or BenchSetup.draft, runs=args.runs)
    print(f"{'row':<24} {'value':>8}   what", flush=True)
    try:
        report = run_rows(args.only, setup, lambda name, r: print(format_row(name, r), flush=True))
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"written to {args.json}", file=sys.stderr)
    return 0

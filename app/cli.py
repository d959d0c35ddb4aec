"""The `mlxchat` command: the chat TUI, `ask`, `bench`, `serve`."""

from __future__ import annotations

import argparse
import sys

from app.options import add_generation_options, add_model_options
from mlxcore.errors import MlxchatError

DESCRIPTION = """Fast, private chat with a Qwen3 model on your own machine.

With no command, mlxchat opens the chat window (the TUI). Offline, it uses the
small embedded demonstration models that ship with it."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlxchat", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_generation_options(parser)
    parser.add_argument("--session", metavar="FILE", help="open (or start) the chat saved in FILE")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    ask = commands.add_parser("ask", help="answer one prompt on stdout",
                              description="Answer one prompt: the answer streams to stdout, "
                                          "the model's thinking to stderr.")
    ask.add_argument("prompt", help='the question; "-" reads it from stdin')
    ask.add_argument("--session", metavar="FILE",
                     help="continue the conversation saved in FILE (created if missing) and save it back")
    ask.add_argument("--json", action="store_true", help="print each token event and the final stats as JSON lines")
    ask.add_argument("--hide-thinking", dest="show_thinking", action="store_false",
                     help="do not print the thinking to stderr")
    add_model_options(ask)
    add_generation_options(ask)

    from app.sessions_cmd import add_sessions_parser
    add_sessions_parser(commands)

    from app.serve.command import add_serve_parser
    add_serve_parser(commands)

    bench = commands.add_parser("bench", help="measure mlxchat against mlx-lm on this machine",
                                description="Run the benchmarks of DESIGN.md's Measures and print a table.")
    bench.add_argument("--json", metavar="FILE", help="also write the results to FILE as JSON")
    bench.add_argument("--runs", type=int, default=5, help="paired runs per ratio (the median is reported)")
    bench.add_argument("--only", metavar="ROW", action="append",
                       help="run only these rows (repeatable, or comma-separated), e.g. --only decode_vs_mlx_lm,blas_speedup")
    bench.add_argument("--model", metavar="REF", default=None, help="target model (default: mini-target, embedded)")
    bench.add_argument("--draft", metavar="REF", default=None, help="draft model (default: mini-draft, embedded)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `mlxchat` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "ask":
            from app.ask import run_ask
            return run_ask(args)
        if args.command == "sessions":
            from app.sessions_cmd import run_sessions
            return run_sessions(args)
        if args.command == "serve":
            from app.serve.command import run_serve
            return run_serve(args)
        if args.command == "bench":
            from app.bench_cmd import run_bench
            return run_bench(args)
        from app.tui import run_tui
        return run_tui(args)
    except MlxchatError as error:
        print(f"mlxchat: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nmlxchat: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `mlxchat` command: the chat TUI, `ask`, `bench`, `serve`, `models`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from app.options import (add_generation_options, add_model_options, add_models_dir_option, check_text_options,
                         model_catalog, models_dir, session_path)
from mlxcore import is_lost_peer, lost_peer
from mlxcore import watch_ring_failures
from mlxcore import current_world, launched, leave_interrupts_to_leader
from mlxcore import MlxchatError, UsageError
from mlxcore import low_limit_note
from sessions import printable
from app.flags import in_flags

# mlx.launch stops every rank once one fails: a rank that leaves the telling to rank 0 waits this long first
FOLLOWER_EXIT_DELAY_S = 1.0
LOADING_COMMANDS = ("ask", "serve", "bench")  # those that load a model and print to a terminal as they run
MODEL_COMMANDS = (None, "ask", "serve", "models")  # those with --models-dir (None: the chat window)
RANKED_COMMANDS = ("ask", "serve")  # what runs on several ranks under mlx.launch (see README, Several machines)
RANKS_EPILOG = ("A model too big for one Mac runs split over several with MLX's launcher, e.g. "
                "mlx.launch --hostfile hosts.json --backend ring -- mlxchat {command} ... (rank 0, the first host, "
                "reads the input and shows the output; see README, Several machines).")

DESCRIPTION = """Fast, private chat with a Qwen3 model on your own machine.

With no command, mlxchat opens the chat window (the TUI). Offline, it uses the
small embedded demonstration models that ship with it."""

MODELS_DESCRIPTION = """List the models that --model names load (in the chat window, F5 lists the same):

  models-dir  each model folder under --models-dir (config.json and model*.safetensors),
              by the folder's name
  hf-cache    each complete snapshot in the Hugging Face cache, by its repo id (org/name)
  embedded    the small demonstration models that ship with mlxchat

A name in both a --models-dir and the cache loads the --models-dir folder. --model also takes
what is not listed: a hub repo id (downloaded when online), or the path of a model folder.
`mlxchat serve` serves the same names (/v1/models), and the model it started with."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlxchat", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser)
    add_generation_options(parser)
    parser.add_argument("--session", metavar="FILE", help="open (or start) the chat saved in FILE")
    parser.add_argument("--mcp-config", metavar="FILE", default=None,
                        help="MCP servers whose tools the chat offers the model, each call asked first "
                             '("mcpServers" JSON; default ~/.config/mlxchat/mcp.json if it exists)')
    parser.add_argument("--demo-tools", action="store_true",
                        help="also offer the three tools the embedded model learned to call (calculator, "
                             "get_time, convert_units), from a bundled MCP server: tool calls offline, e.g. "
                             '"what is 417 times 386?"')
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    ask = commands.add_parser("ask", help="answer one prompt on stdout",
                              description="Answer one prompt: the answer streams to stdout, "
                                          "the model's thinking to stderr.",
                              epilog=RANKS_EPILOG.format(command="ask"))
    ask.add_argument("prompt", help='the question; "-" reads it from stdin')
    ask.add_argument("--session", metavar="FILE",
                     help="continue the conversation saved in FILE (created if missing) and save it back")
    ask.add_argument("--json", action="store_true", help="print each token event and the final stats as JSON lines")
    ask.add_argument("--json-schema", metavar="FILE",
                     help="answer with JSON that validates against the JSON Schema in FILE (thinking stays free)")
    ask.add_argument("--hide-thinking", dest="show_thinking", action="store_false",
                     help="do not print the thinking to stderr")
    add_model_options(ask)
    add_generation_options(ask)

    from app.sessions_cmd import add_sessions_parser
    add_sessions_parser(commands)

    from app.serve.command import add_serve_parser
    add_serve_parser(commands, epilog=RANKS_EPILOG.format(command="serve"))

    models = commands.add_parser("models", help="list the models --model names load",
                                 description=MODELS_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_models_dir_option(models)
    models.add_argument("--json", action="store_true",
                        help='print {"models_dir", "hub_cache", "models": [{"id", "source", "path"}]} as JSON')

    bench = commands.add_parser("bench", help="measure mlxchat against mlx-lm on this machine",
                                description="Measure mlxchat against mlx-lm on this machine and print a table, a row "
                                "as each ends. The default rows (decode, speculative decoding, batching, the server, "
                                "sessions) take about 5 minutes on an M-series Mac; --all runs every row (hours). "
                                "Exit status 1 if a row failed (its error is printed in its place).")
    bench.add_argument("--json", metavar="FILE",
                       help="also write the results to FILE as JSON, after each row: the machine, chip, memory, OS, "
                            "MLX and mlx-lm versions, models and every figure (what a bug report needs)")
    bench.add_argument("--all", action="store_true", help="run every row, not only the default ones")
    bench.add_argument("--smoke", action="store_true",
                       help="every row at its smallest setting: checks that the rows run, in seconds; its figures "
                            "mean nothing")
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
        check_text_options(args)
        if args.command in MODEL_COMMANDS:
            models_dir(args)  # a folder, or a one-line error before anything loads
        if args.command is None and args.session:  # the chat window's file (ask checks its own on rank 0)
            session_path(args.session)
        if args.command in LOADING_COMMANDS and (note := low_limit_note()) and _leads():
            print(f"mlxchat: {note}", file=sys.stderr)
        if launched() and args.command not in RANKED_COMMANDS:
            raise UsageError(f"{_name(args.command)} runs in one process; over several ranks (mlx.launch) run "
                             "`mlxchat serve` (rank 0 serves the OpenAI API) or `mlxchat ask`.")
        if launched():  # before any collective: a peer lost while this rank waits must not hang it
            watch_ring_failures(current_world())
            leave_interrupts_to_leader(current_world())
        if args.command == "ask":
            from app.ask import run_ask
            return run_ask(args)
        if args.command == "sessions":
            from app.sessions_cmd import run_sessions
            return run_sessions(args)
        if args.command == "serve":
            from app.serve.command import run_serve
            return run_serve(args)
        if args.command == "models":
            return run_models(args)
        if args.command == "bench":
            from bench.command import run_bench
            return run_bench(args)
        from app.tui.run import run_tui
        return run_tui(args)
    except MlxchatError as error:
        if not _report(error):
            time.sleep(FOLLOWER_EXIT_DELAY_S)
        return 2
    except RuntimeError as error:  # a collective whose peer went away (a rank killed or its machine gone)
        if not is_lost_peer(error):
            raise
        world = current_world()
        _report(lost_peer(error, world.rank, world.size))
        return 1
    except KeyboardInterrupt:
        if _leads():  # over several ranks every rank stops; rank 0 says so
            print("\nmlxchat: interrupted", file=sys.stderr)
        return 130


def run_models(args: argparse.Namespace) -> int:
    """`mlxchat models`: what --model names load, one a line (or JSON)."""
    from mlxcore import hub_cache_dir
    entries = model_catalog(models_dir(args)).listing()
    rows = [{"id": e.id, "source": e.source, "path": str(e.folder) if e.folder else None} for e in entries]
    if args.json:
        print(json.dumps({"models_dir": str(args.models_dir) if args.models_dir else None,
                          "hub_cache": str(hub_cache_dir()), "models": rows}, indent=2))
        return 0
    width = max((len(e.id) for e in entries), default=0)
    for e in entries:  # names and paths come from the disk: printable, as any file name shown
        name, path = printable(e.id, limit=None), printable(str(e.folder) if e.folder else "", limit=None)
        print(f"{name:<{width}}  {e.source:<10}  {path}")
    return 0


def _name(command: str | None) -> str:
    return "The chat window" if command is None else f"`mlxchat {command}`"


def _report(error: MlxchatError) -> bool:
    """The error on stderr; over several ranks, rank 0's only (they all meet it), unless each rank's own.
    False when another rank reports it."""
    if _leads() or getattr(error, "every_rank_reports", False):
        print(f"mlxchat: {printable(in_flags(str(error)), limit=None)}", file=sys.stderr)  # it may quote a file's text
        return True
    return False


def _leads() -> bool:
    """Whether this process speaks for the run: one process, or rank 0 (or any rank, if the group never formed)."""
    try:
        return not launched() or current_world().leader
    except MlxchatError:
        return True


if __name__ == "__main__":
    sys.exit(main())

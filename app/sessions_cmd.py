"""`mlxchat sessions ls|show|rm|export|rename|disk-kv`: the stored sessions (and the KV disk tier), without
loading a model."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sessions import printable

if TYPE_CHECKING:  # the store imports mlx: only when a sessions command runs, not to build --help
    from sessions import SessionInfo


def add_sessions_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the `sessions` command and its sub-commands to the CLI's sub-parsers."""
    parser = subparsers.add_parser("sessions", help="list, show, rename, delete or export saved sessions",
                                   description="Manage the sessions saved in mlxchat's data folder "
                                               "($MLXCHAT_HOME/sessions when set).")
    parser.add_argument("--store", metavar="DIR", type=Path, default=None,
                        help="the folder of the session files (default: mlxchat's data folder)")
    actions = parser.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    actions.add_parser("ls", help="list the sessions, most recent first").add_argument(
        "search", nargs="?", default=None, help="only sessions whose title contains this text")
    actions.add_parser("show", help="print a session's details and transcript").add_argument("id")
    actions.add_parser("rm", help="delete a session").add_argument("id")
    export = actions.add_parser("export", help="write a session as a Markdown transcript, or as a session file",
                                description="Print a session's Markdown transcript, or write it to FILE. A FILE "
                                            "ending in .mlxchat gets the whole session instead (history, settings "
                                            "and caches) in one file, for `mlxchat --session FILE` or "
                                            "`mlxchat ask --session FILE`, here or on another Mac.")
    export.add_argument("id")
    export.add_argument("-o", "--output", metavar="FILE", type=Path, default=None,
                        help="write to FILE instead of stdout (FILE.mlxchat: a session file)")
    disk = actions.add_parser("disk-kv", help="show (or --clear) the KV blocks kept on disk for long prompts",
                              description="KV blocks that left memory, kept on disk (--disk-kv) so that a long "
                                          "prompt seen before is read back instead of computed again. Saved "
                                          "sessions are not among them.")
    disk.add_argument("--clear", action="store_true", help="remove every block")
    rename = actions.add_parser("rename", help="set a session's title")
    rename.add_argument("id")
    rename.add_argument("title")
    return parser


def run_sessions(args: argparse.Namespace) -> int:
    """Run one `sessions` sub-command; errors are raised as ``MlxchatError`` for the CLI to print."""
    from sessions import SUFFIX, SessionStore

    command = args.sessions_command
    if command == "disk-kv":
        return _disk_kv(args.clear)
    store = SessionStore(args.store)
    if command == "ls":
        infos = store.search(args.search) if args.search else store.list()
        print("\n".join(_row(info) for info in infos) if infos else f"No saved sessions in {store.root}.")
    elif command == "show":
        info = store.info(args.id)
        where = f"file: {info.path}" if info.in_file else f"store: {store.root}"
        print(f"id: {info.id}\n{where}\nmodel: {printable(info.model)}\nmessages: {info.messages}\n")
        sys.stdout.write(printable(store.export_markdown(args.id), limit=None, keep="\n\t"))
    elif command == "rm":
        store.delete(args.id)
        print(f"Deleted session {args.id}.")
    elif command == "export" and args.output is not None and args.output.suffix == SUFFIX:
        store.export_file(args.id, args.output)
        print(f"Wrote {args.output}: open it with `mlxchat --session {args.output}`.")
    elif command == "export":
        text = store.export_markdown(args.id)
        if args.output is None:  # a terminal gets what it would act on made visible; a pipe, the exact text
            sys.stdout.write(printable(text, limit=None, keep="\n\t") if sys.stdout.isatty() else text)
        else:
            _write_text(args.output, text)
            print(f"Wrote {args.output}.")
    elif command == "rename":
        print(f"{args.id}: {printable(store.rename(args.id, args.title).title)}")
    return 0


def _disk_kv(clear: bool) -> int:
    from app.options import disk_kv_folder
    from mlxcore import DiskTier, format_bytes

    folder = disk_kv_folder()
    tier = DiskTier(folder, 1 << 62)  # no budget here: showing or clearing evicts nothing by itself
    blocks, size = tier.blocks, tier.bytes
    if clear:
        tier.clear()
        print(f"Removed {blocks} KV blocks ({format_bytes(size)}) from {folder}.")
    else:
        print(f"{folder}: {blocks} KV blocks, {format_bytes(size)}.")
    return 0


def _row(info: SessionInfo) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.updated))
    if info.broken:
        return f"{info.id}  {when}  BROKEN: {printable(info.broken, limit=None)}"
    where = "  (open in an mlxchat window)" if info.open_elsewhere else ""
    return f"{info.id}  {when}  {info.messages:>3} msgs  {printable(info.model)}  {printable(info.title)}{where}"


def _write_text(path: Path, text: str) -> None:
    """Write an exported transcript; SessionFileError (one line) when ``path`` cannot be written."""
    from sessions import SessionFileError
    from sessions import cannot_write_text

    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise SessionFileError(cannot_write_text(path, error)) from None

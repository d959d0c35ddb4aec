"""The Textual chat: `mlxchat` with no command opens it."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from app.tui.protocol import Open


def open_command(args: argparse.Namespace) -> Open:
    """The engine host's first command, from mlxchat's options (checked here: UsageError when they don't fit)."""
    from app.options import generation_params, kv_config
    kv, params = kv_config(args), generation_params(args)
    return Open(model=args.model, draft=args.draft, no_draft=args.no_draft, kv=kv.kind, max_kv=kv.max_kv,
                block_size=kv.block_size, params=asdict(params), system=args.system, think=args.think,
                session_file=getattr(args, "session", None))


def run_tui(args: argparse.Namespace) -> int:
    """Run the chat until the user quits; returns the exit status."""
    from app.tui.app import ChatApp
    result = ChatApp(open_command(args)).run()
    return result or 0

"""`mlxchat` with no command: the window's first command from the options, and the window until it quits."""

from __future__ import annotations

import argparse

from app.engine_host.protocol import Open


def open_command(args: argparse.Namespace) -> Open:
    """The engine host's first command, from mlxchat's options (checked here: UsageError when they don't fit)."""
    from app.options import generation_params, given_params, kv_config, model_choice
    from mlxcore import check_num_draft
    kv = kv_config(args)
    generation_params(args)  # out-of-range values fail here, before the window opens
    choice = model_choice(args)  # a --models-dir name or a cached repo, as `ask` resolves it
    return Open(model=choice.model, draft=choice.draft, no_draft=choice.no_draft, kv=kv.kind, max_kv=kv.max_kv,
                max_kv_bytes=kv.max_kv_bytes, block_size=kv.block_size, kv_bits=kv.kv_bits,
                disk_kv_bytes=kv.disk_kv_bytes, disk_kv_dir=kv.disk_kv_dir,
                num_draft=check_num_draft(args.num_draft), params=given_params(args),
                system=args.system, think=args.think,
                session_file=getattr(args, "session", None))


def run_tui(args: argparse.Namespace) -> int:
    """Run the chat until the user quits; returns the exit status."""
    from app.options import models_dir
    from app.tui.app import ChatApp
    config, servers = mcp_servers(getattr(args, "mcp_config", None), getattr(args, "demo_tools", False))
    result = ChatApp(open_command(args), mcp_servers=servers, mcp_config=config, models_dir=models_dir(args)).run()
    return result or 0


def mcp_servers(given: str | None, demo: bool = False) -> tuple[str | None, list]:
    """The MCP config file to read (``--mcp-config``, else the default one if it exists) and its servers,
    then the bundled demo server (``--demo-tools``); McpConfigError before the window opens when the file
    cannot be read."""
    from app.mcp.config import default_config, demo_config, read_config
    path = given or default_config()
    servers = read_config(path) if path is not None else []
    if demo and all(s.name != "demo" for s in servers):
        servers.append(demo_config())
    return (str(path) if path is not None else None), servers

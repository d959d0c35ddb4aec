"""The chat window as users run it, for a test that reads the raw bytes it writes to a terminal (a pty).

``python tests/tui_pty_window.py MCP_CONFIG``: the real ChatApp (Textual's terminal driver, not headless) on the
embedded pair, its engine in a child process with scripted replies (``mcp_engine``: the rules in the file named
by ``MLXCHAT_TEST_SCRIPT``), the MCP servers of MCP_CONFIG started over stdio. It runs until ctrl+q.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from app.mcp.config import read_config  # noqa: E402
from app.tui import engine_client  # noqa: E402
from app.tui.app import ChatApp  # noqa: E402
from mcp_engine import scripted_engine_process  # noqa: E402
from test_tui_helpers import open_command  # noqa: E402

if __name__ == "__main__":
    engine_client.run_engine_process = scripted_engine_process  # 'spawn' starts it in the engine's process
    config = sys.argv[1]
    sys.exit(ChatApp(open_command(max_tokens=200), mcp_servers=read_config(config), mcp_config=config).run() or 0)

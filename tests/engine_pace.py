"""The window's engine process sending every piece of text as its own Chunk, for tests that act mid-reply.

``every_token_engine_process`` stands in for ``app.tui.engine_client.run_engine_process`` (``send_every_token``
in test_tui_helpers patches it there; 'spawn' then starts this module's function in the child).
"""

from __future__ import annotations


def every_token_engine_process(conn, log_path: str) -> None:
    from app.engine_host import reply_stream
    from app.tui.engine_client import run_engine_process

    reply_stream.FLUSH_SECONDS = 0.0  # for the life of this process
    run_engine_process(conn, log_path)

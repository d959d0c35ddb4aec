"""The chat window's engine host: owns the Engine, the open chats and the session store in the engine process,
and serves the window's commands (``protocol.py``) over a channel (``channel.py``). ``server.EngineServer`` is
the host; the window starts it through ``app.tui.engine_client``. Importing this package loads nothing heavy:
the window's own process imports the protocol and never loads MLX."""

"""The chat window's engine host: owns the Engine, the open chats and the session store in the engine process,
and serves the window's commands (``protocol.py``) over a channel (``channel.py``).

``server.EngineServer`` is the host: one class that owns small parts, each given what it needs: the inbox of
commands, the models (``model_holder``), the open chats (``chats``), autosave, what the UI is told of the chat
on screen (``publisher``), replies (``replies``, ``reply_run``, ``sync_reply``), the store's jobs
(``store_jobs``), the opening of a model and a chat (``opening``) and the chat's own commands
(``chat_commands``). Errors reach the window as Failure events with a code (``failure_text``). The window
starts the host through ``app.tui.engine_client``. Importing this package loads nothing heavy: the window's
own process imports the protocol and never loads MLX."""

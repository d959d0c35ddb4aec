"""The Textual chat: `mlxchat` with no command opens it (``app.tui.run``)."""

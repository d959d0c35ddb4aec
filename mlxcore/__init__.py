"""mlxchat's MLX backend: models, KV caches, sampling, plain and speculative decoding.

The names a program needs import from here (``from mlxcore import open_engine,
GenerationParams``). They load on first use, so that ``import mlxcore`` stays
light: the chat window's process imports it and never runs MLX.
"""

import importlib

from mlxcore.blas import preload_optimized_blas
from mlxcore.open_files import guard_mlx_lm_import

preload_optimized_blas()  # must run before mlx.core is imported anywhere
guard_mlx_lm_import()  # before mlx_lm is imported anywhere: its import sets the open-file limit

_EXPORTS = {
    "open_engine": "mlxcore.launch", "OpenedEngine": "mlxcore.launch",
    "ModelChoice": "mlxcore.configs", "KVConfig": "mlxcore.configs",
    "GenerationParams": "mlxcore.params", "Engine": "mlxcore.engine",
    "TokenEvent": "mlxcore.events", "FinalEvent": "mlxcore.events", "GenerationStats": "mlxcore.events",
    "render_chat": "mlxcore.chat_template", "load_model": "mlxcore.loading",
    "MlxchatError": "mlxcore.errors", "UsageError": "mlxcore.errors", "PromptError": "mlxcore.errors",
    "ModelLoadError": "mlxcore.errors", "SystemPromptTooLongError": "mlxcore.errors",
    "Event": "mlxcore.events", "render_chat_text": "mlxcore.chat_template", "check_num_draft": "mlxcore.configs",
    "ToolCall": "mlxcore.tool_calls", "ToolCallError": "mlxcore.tool_calls", "parse_call": "mlxcore.tool_calls",
    "CALL_CLOSE": "mlxcore.tool_calls", "CacheMeta": "mlxcore.kv.base",
    "ReplyParser": "mlxcore.reply_parser", "ParsedDelta": "mlxcore.reply_parser", "CallDelta": "mlxcore.reply_parser",
    "Grammar": "mlxcore.grammar", "json_schema": "mlxcore.grammar",
    "json_object": "mlxcore.grammar", "tool_call_grammar": "mlxcore.grammar",
    "thought_reply": "mlxcore.think_blocks", "close_open_block": "mlxcore.think_blocks",
    "OPEN": "mlxcore.think_blocks", "EMPTY": "mlxcore.think_blocks",
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605  (the lazy names, listed once above)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mlxcore' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value

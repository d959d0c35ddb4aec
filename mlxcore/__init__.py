"""mlxchat's MLX backend: models, KV caches, sampling, plain and speculative decoding.

The names a program needs import from here (``from mlxcore import open_engine,
GenerationParams``). They load on first use, so that ``import mlxcore`` stays
light: the chat window's process imports it and never runs MLX.
"""

import importlib
from typing import TYPE_CHECKING

from mlxcore.blas import preload_optimized_blas
from mlxcore.open_files import guard_mlx_lm_import

preload_optimized_blas()  # must run before mlx.core is imported anywhere
guard_mlx_lm_import()  # before mlx_lm is imported anywhere: its import sets the open-file limit

if TYPE_CHECKING:  # what the lazy names are, for type checkers (``__getattr__`` loads them)
    from mlxcore.chat_template import render_chat as render_chat, render_chat_text as render_chat_text
    from mlxcore.configs import KVConfig as KVConfig, ModelChoice as ModelChoice, check_num_draft as check_num_draft
    from mlxcore.engine import Engine as Engine
    from mlxcore.errors import (MlxchatError as MlxchatError, ModelLoadError as ModelLoadError,
        PromptError as PromptError, SystemPromptTooLongError as SystemPromptTooLongError, UsageError as UsageError)
    from mlxcore.events import (Event as Event, FinalEvent as FinalEvent, GenerationStats as GenerationStats,
        TokenEvent as TokenEvent)
    from mlxcore.grammar import (Grammar as Grammar, json_object as json_object, json_schema as json_schema,
        tool_call_grammar as tool_call_grammar)
    from mlxcore.kv.base import CacheCounters as CacheCounters, CacheMeta as CacheMeta
    from mlxcore.launch import OpenedEngine as OpenedEngine, open_engine as open_engine
    from mlxcore.loading import load_model as load_model
    from mlxcore.params import GenerationParams as GenerationParams
    from mlxcore.reply_parser import CallDelta as CallDelta, ParsedDelta as ParsedDelta, ReplyParser as ReplyParser
    from mlxcore.think_blocks import (EMPTY as EMPTY, OPEN as OPEN, close_open_block as close_open_block,
        thought_reply as thought_reply)
    from mlxcore.tool_calls import (CALL_CLOSE as CALL_CLOSE, ToolCall as ToolCall, ToolCallError as ToolCallError,
        parse_call as parse_call)

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
    "CALL_CLOSE": "mlxcore.tool_calls", "CacheMeta": "mlxcore.kv.base", "CacheCounters": "mlxcore.kv.base",
    "ReplyParser": "mlxcore.reply_parser", "ParsedDelta": "mlxcore.reply_parser", "CallDelta": "mlxcore.reply_parser",
    "Grammar": "mlxcore.grammar", "json_schema": "mlxcore.grammar",
    "json_object": "mlxcore.grammar", "tool_call_grammar": "mlxcore.grammar",
    "thought_reply": "mlxcore.think_blocks", "close_open_block": "mlxcore.think_blocks",
    "OPEN": "mlxcore.think_blocks", "EMPTY": "mlxcore.think_blocks",
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605  (the lazy names, listed once above)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mlxcore' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value

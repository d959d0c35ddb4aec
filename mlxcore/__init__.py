"""mlxchat's MLX backend: models, KV caches, sampling, plain and speculative decoding.

The names a program needs import from here (``from mlxcore import open_engine,
GenerationParams``). They load on first use, so that ``import mlxcore`` stays
light: the chat window's process imports it and never runs MLX.
"""

import importlib
from typing import TYPE_CHECKING

from mlxcore.blas import preload_optimized_blas
from mlxcore.open_files import guard_mlx_lm_import
from mlxcore.precision import keep_float32_products

preload_optimized_blas()  # must run before mlx.core is imported anywhere
keep_float32_products()  # before MLX's first product, which reads it
guard_mlx_lm_import()  # before mlx_lm is imported anywhere: its import sets the open-file limit

if TYPE_CHECKING:  # what the lazy names are, for type checkers (``__getattr__`` loads them)
    from mlxcore.batching.errors import OverloadedError as OverloadedError, PromptTooLongError as PromptTooLongError
    from mlxcore.batching.handle import RequestFailedError as RequestFailedError, RequestHandle as RequestHandle
    from mlxcore.batching.local import LocalBatch as LocalBatch, drain as drain
    from mlxcore.batching.request import Priority as Priority, Request as Request
    from mlxcore.batching.stats import WorkerStats as WorkerStats
    from mlxcore.batching.worker import (BatchWorker as BatchWorker, IDLE as IDLE,
        IDLE_WAIT_SECONDS as IDLE_WAIT_SECONDS, PAUSED_WAIT_SECONDS as PAUSED_WAIT_SECONDS, STEPPED as STEPPED)
    from mlxcore.caches import Caches as Caches
    from mlxcore.chat_template import render_chat as render_chat, render_chat_text as render_chat_text
    from mlxcore.configs import (KVConfig as KVConfig, LOOKUP as LOOKUP, ModelChoice as ModelChoice,
                                 check_num_draft as check_num_draft)
    from mlxcore.distributed.broadcast import share as share
    from mlxcore.distributed.errors import (DistributedError as DistributedError, is_lost_peer as is_lost_peer,
        lost_peer as lost_peer)
    from mlxcore.distributed.fail_fast import (exit_on_lost_peer as exit_on_lost_peer,
        watch_ring_failures as watch_ring_failures)
    from mlxcore.distributed.interrupts import SharedInterrupt as SharedInterrupt
    from mlxcore.distributed.ranked_worker import RankedWorker as RankedWorker, serve_followers as serve_followers
    from mlxcore.distributed.watchdog import Watchdog as Watchdog
    from mlxcore.distributed.world import (World as World, current_world as current_world, launched as launched,
        leave_interrupts_to_leader as leave_interrupts_to_leader)
    from mlxcore.engine import Engine as Engine
    from mlxcore.errors import (MlxchatError as MlxchatError, ModelLoadError as ModelLoadError,
        PromptError as PromptError, SystemPromptTooLongError as SystemPromptTooLongError,
        TokenizerMismatchError as TokenizerMismatchError, UsageError as UsageError)
    from mlxcore.buffer_cache import release_models as release_models
    from mlxcore.events import (Event as Event, FinalEvent as FinalEvent, GenerationStats as GenerationStats,
        TokenEvent as TokenEvent)
    from mlxcore.fingerprint import WEIGHTS_GLOB as WEIGHTS_GLOB
    from mlxcore.batching.constraints import compile_matcher as compile_matcher
    from mlxcore.batching.grammar_close import shortest_reply as shortest_reply
    from mlxcore.grammar import (Grammar as Grammar, json_object as json_object, json_schema as json_schema,
        tool_call_grammar as tool_call_grammar)
    from mlxcore.schema_checks import check_schema as check_schema
    from mlxcore.held_tokens import prompt_ids as prompt_ids
    from mlxcore.hub import download as download
    from mlxcore.hub_names import hub_cache_dir as hub_cache_dir, is_repo_id as is_repo_id, local_model as local_model
    from mlxcore.kv.base import CacheCounters as CacheCounters, CacheMeta as CacheMeta, ModelCache as ModelCache
    from mlxcore.kv.hybrid import HybridCache as HybridCache
    from mlxcore.kv.budget import KVLimit as KVLimit, format_bytes as format_bytes, parse_max_kv as parse_max_kv
    from mlxcore.kv.errors import (CacheShapeError as CacheShapeError, CacheStateError as CacheStateError,
        PoolExhaustedError as PoolExhaustedError)
    from mlxcore.kv.block_frame import (block_payload as block_payload, frame_block as frame_block,
        token_bytes as token_bytes, tokens_from as tokens_from, unframe_block as unframe_block)
    from mlxcore.kv.disk_tier import (DiskTier as DiskTier, default_disk_budget as default_disk_budget,
        disk_tiers as disk_tiers)
    from mlxcore.kv.geometry import KVGeometry as KVGeometry
    from mlxcore.kv.kv_format import (KVFormat as KVFormat, KVFormatError as KVFormatError,
        SUPPORTED_BITS as SUPPORTED_BITS, kv_format as kv_format)
    from mlxcore.kv.stored import tensor_names as tensor_names
    from mlxcore.kv.window import Window as Window
    from mlxcore.launch import OpenedEngine as OpenedEngine, open_engine as open_engine
    from mlxcore.open_files import low_limit_note as low_limit_note
    from mlxcore.params import GenerationParams as GenerationParams
    from mlxcore.prefill import Progress as Progress, StopPrefill as StopPrefill
    from mlxcore.reply_parser import CallDelta as CallDelta, ParsedDelta as ParsedDelta, ReplyParser as ReplyParser
    from mlxcore.sequences import common_prefix_length as common_prefix_length
    from mlxcore.think_blocks import (EMPTY as EMPTY, OPEN as OPEN, close_open_block as close_open_block,
        thought_reply as thought_reply)
    from mlxcore.tool_calls import (CALL_CLOSE as CALL_CLOSE, ToolCall as ToolCall, ToolCallError as ToolCallError,
        parse_call as parse_call)

_EXPORTS = {
    "OverloadedError": "mlxcore.batching.errors", "PromptTooLongError": "mlxcore.batching.errors",
    "RequestFailedError": "mlxcore.batching.handle", "RequestHandle": "mlxcore.batching.handle",
    "LocalBatch": "mlxcore.batching.local", "drain": "mlxcore.batching.local",
    "Priority": "mlxcore.batching.request", "Request": "mlxcore.batching.request",
    "WorkerStats": "mlxcore.batching.stats",
    "BatchWorker": "mlxcore.batching.worker", "IDLE": "mlxcore.batching.worker",
    "IDLE_WAIT_SECONDS": "mlxcore.batching.worker", "PAUSED_WAIT_SECONDS": "mlxcore.batching.worker",
    "STEPPED": "mlxcore.batching.worker",
    "Caches": "mlxcore.caches",
    "render_chat": "mlxcore.chat_template", "render_chat_text": "mlxcore.chat_template",
    "KVConfig": "mlxcore.configs", "ModelChoice": "mlxcore.configs", "check_num_draft": "mlxcore.configs",
    "LOOKUP": "mlxcore.configs",
    "share": "mlxcore.distributed.broadcast",
    "DistributedError": "mlxcore.distributed.errors", "is_lost_peer": "mlxcore.distributed.errors",
    "lost_peer": "mlxcore.distributed.errors",
    "exit_on_lost_peer": "mlxcore.distributed.fail_fast", "watch_ring_failures": "mlxcore.distributed.fail_fast",
    "SharedInterrupt": "mlxcore.distributed.interrupts",
    "RankedWorker": "mlxcore.distributed.ranked_worker", "serve_followers": "mlxcore.distributed.ranked_worker",
    "Watchdog": "mlxcore.distributed.watchdog",
    "World": "mlxcore.distributed.world", "current_world": "mlxcore.distributed.world",
    "launched": "mlxcore.distributed.world", "leave_interrupts_to_leader": "mlxcore.distributed.world",
    "Engine": "mlxcore.engine",
    "MlxchatError": "mlxcore.errors", "ModelLoadError": "mlxcore.errors", "PromptError": "mlxcore.errors",
    "SystemPromptTooLongError": "mlxcore.errors", "TokenizerMismatchError": "mlxcore.errors",
    "UsageError": "mlxcore.errors",
    "release_models": "mlxcore.buffer_cache",
    "Event": "mlxcore.events", "FinalEvent": "mlxcore.events", "GenerationStats": "mlxcore.events",
    "TokenEvent": "mlxcore.events",
    "WEIGHTS_GLOB": "mlxcore.fingerprint",
    "Grammar": "mlxcore.grammar", "json_object": "mlxcore.grammar", "json_schema": "mlxcore.grammar",
    "tool_call_grammar": "mlxcore.grammar", "compile_matcher": "mlxcore.batching.constraints",
    "shortest_reply": "mlxcore.batching.grammar_close",
    "check_schema": "mlxcore.schema_checks",
    "prompt_ids": "mlxcore.held_tokens",
    "download": "mlxcore.hub",
    "hub_cache_dir": "mlxcore.hub_names", "is_repo_id": "mlxcore.hub_names", "local_model": "mlxcore.hub_names",
    "CacheCounters": "mlxcore.kv.base", "CacheMeta": "mlxcore.kv.base", "ModelCache": "mlxcore.kv.base",
    "HybridCache": "mlxcore.kv.hybrid",
    "KVLimit": "mlxcore.kv.budget", "format_bytes": "mlxcore.kv.budget", "parse_max_kv": "mlxcore.kv.budget",
    "CacheShapeError": "mlxcore.kv.errors", "CacheStateError": "mlxcore.kv.errors",
    "PoolExhaustedError": "mlxcore.kv.errors",
    "block_payload": "mlxcore.kv.block_frame", "frame_block": "mlxcore.kv.block_frame",
    "token_bytes": "mlxcore.kv.block_frame", "tokens_from": "mlxcore.kv.block_frame",
    "unframe_block": "mlxcore.kv.block_frame",
    "DiskTier": "mlxcore.kv.disk_tier", "default_disk_budget": "mlxcore.kv.disk_tier",
    "disk_tiers": "mlxcore.kv.disk_tier",
    "KVGeometry": "mlxcore.kv.geometry",
    "KVFormat": "mlxcore.kv.kv_format", "KVFormatError": "mlxcore.kv.kv_format",
    "SUPPORTED_BITS": "mlxcore.kv.kv_format", "kv_format": "mlxcore.kv.kv_format",
    "tensor_names": "mlxcore.kv.stored",
    "Window": "mlxcore.kv.window",
    "OpenedEngine": "mlxcore.launch", "open_engine": "mlxcore.launch",
    "low_limit_note": "mlxcore.open_files",
    "GenerationParams": "mlxcore.params",
    "Progress": "mlxcore.prefill", "StopPrefill": "mlxcore.prefill",
    "CallDelta": "mlxcore.reply_parser", "ParsedDelta": "mlxcore.reply_parser", "ReplyParser": "mlxcore.reply_parser",
    "common_prefix_length": "mlxcore.sequences",
    "EMPTY": "mlxcore.think_blocks", "OPEN": "mlxcore.think_blocks", "close_open_block": "mlxcore.think_blocks",
    "thought_reply": "mlxcore.think_blocks",
    "CALL_CLOSE": "mlxcore.tool_calls", "ToolCall": "mlxcore.tool_calls", "ToolCallError": "mlxcore.tool_calls",
    "parse_call": "mlxcore.tool_calls",
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605  (the lazy names, listed once above)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mlxcore' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value

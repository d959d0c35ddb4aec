"""Bench row ``kv8_session_file_ratio``: bytes of a session file with 8-bit KV / the same chat's with float KV.

A greedy chat of ``min_tokens``+ tokens (``bench_restore.long_session``) on the named pair
with float caches is saved to a file; that file is opened on an engine with 8-bit caches
(the caches converted through float: the same tokens, the same history) and saved again.
The value is the 8-bit file's bytes / the float file's, whole files (header, index and
checksums included). Also reported: the ratio of the tensor payloads alone and the one the
KV format predicts (``KVGeometry.token_bytes``, 8-bit / float), which the payload (the file's
blocks: their tensors, and 4 bytes a token for its id) meets
when the blocks are saved as they are stored, and the format's prediction for the users'
pair's geometry (bfloat16 heads of 128). The bytes do not vary between runs: one run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mlxcore.engine import KVConfig
from mlxcore.kv.kv_format import kv_format
from mlxcore.launch import ModelChoice, open_engine
from bench.session_restore import long_session
from sessions.file_read import read_contents
from sessions.chat_session import ChatSession


def kv8_session_file_ratio(target_ref: str, draft_ref: str | None, *, min_tokens: int = 2000) -> dict:
    """The row: see the module docstring."""
    engines = {bits: open_engine(ModelChoice(model=target_ref, draft=draft_ref, no_draft=draft_ref is None),
                                 KVConfig(kind="paged", kv_bits=bits)).engine for bits in (None, 8)}
    session = long_session(engines[None], min_tokens)
    with tempfile.TemporaryDirectory() as folder:
        paths = {"float": Path(folder) / "float.mlxchat", "q8": Path(folder) / "q8.mlxchat"}
        session.save(paths["float"])
        converted = ChatSession.load(paths["float"], engines[8])
        assert converted.caches.tokens == session.caches.tokens
        converted.save(paths["q8"])
        files = {name: path.stat().st_size for name, path in paths.items()}
        payloads = {name: sum(len(b) for blocks in read_contents(path).blocks.values() for b in blocks)
                    for name, path in paths.items()}
    return {"value": files["q8"] / files["float"], "float_bytes": files["float"], "q8_bytes": files["q8"],
            "payload_ratio": payloads["q8"] / payloads["float"],
            "format_ratio": converted.caches.target.geometry.token_bytes / session.caches.target.geometry.token_bytes,
            "bf16_head128_format_ratio": _format_ratio(kv_heads=8, head_dim=128, dtype_size=2),
            "tokens": session.caches.target.offset, "goal": "<= 0.55"}


def _format_ratio(kv_heads: int, head_dim: int, dtype_size: int) -> float:
    """What the format predicts for another geometry: the users' pair (Qwen3, bfloat16 heads of 128) saves
    groups of 64 numbers with a 2-byte scale and bias each, so its files shrink less than float32 ones."""
    q8, float_ = kv_format(8, head_dim), kv_format(None, head_dim)
    return q8.token_bytes(kv_heads, head_dim, dtype_size) / float_.token_bytes(kv_heads, head_dim, dtype_size)

"""The JSON header of a session file as this mlxchat writes it (file_header.py builds it), as TypedDicts.

A header read from a file is untrusted: it stays a ``dict[str, object]`` until
``read_saved_session`` has checked every field (json_fields.py). Pure Python (no MLX).
"""

from __future__ import annotations

from typing import TypedDict


class ModelHeader(TypedDict):
    name: str  # as the user named it ("" when unknown)
    fingerprint: str


class LinearHeader(TypedDict):
    """A hybrid model's linear-layer states (version 4): sets of every linear layer's state."""

    offsets: list[int]  # the tokens each set had read, oldest first; the last is the cache's own
    shapes: dict[str, list[object]]  # "<linear layer>.<part>" -> [safetensors dtype, shape], every set alike


class _CacheFields(TypedDict):
    """One model's cache: its shape, format and token ids (the tensors are in the payload or the blocks)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str  # safetensors name: "F32", "F16", "BF16"
    kv_format: str  # "float", "q8g32", ... (saved_kv.py)
    tokens: list[int]
    state: dict[str, object]  # state_dict's metadata but kind, tokens and format: the kind's counters


class CacheHeader(_CacheFields, total=False):
    linear: LinearHeader  # a hybrid model's (Qwen3.5) only


class CachesHeader(TypedDict):
    kind: str  # "standard", "paged", "rotating"
    target: CacheHeader | None  # None: not saved
    draft: CacheHeader | None


class Header(TypedDict):
    """A whole session header, in the order its JSON has the keys."""

    format: str  # "mlxchat-session"
    version: int  # file_header.py's versions
    created: float  # seconds since the epoch
    updated: float
    title: str | None
    model: ModelHeader
    draft: ModelHeader | None  # None: saved without a draft model
    params: dict[str, object]  # GenerationParams' fields (a tuple as a list)
    enable_thinking: bool
    use_draft: bool
    system: str | None
    history: list[dict[str, str]]  # {"role", "content"} after the system prompt
    cache: CachesHeader

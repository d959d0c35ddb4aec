"""The JSON header of a session file: built from a session, and read back with every field checked.

``read_saved_session`` turns an untrusted dict into a ``SavedSession`` or
raises ``SessionFileError`` naming the field; nothing is built from a header
that did not pass.

Versions: 1 holds float caches; 2 added quantized ones (each cache's ``kv_format``,
its tensors laid out as saved_kv.py says); both are whole files (file_format.py).
3 is the appending layout (file_layout.py), whatever its caches' format. 4 added a hybrid
model's linear-layer states (``SavedLinear``), in the appending layout or the store.
``build_header`` gives the lowest of 1, 2 and 4 that describes the caches (what the store
keeps, and what a whole file of formats 1 and 2 holds); a session file's writer makes it
3 or 4 (``appending_version``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import mlx.core as mx

from mlxcore import KVGeometry
from mlxcore import KVFormat
from mlxcore import Window
from mlxcore import GenerationParams
from sessions.errors import SessionFileError
from sessions.header_types import CacheHeader, Header
from sessions.json_fields import (Fields, is_bool, is_count, is_count_list, is_list, is_number, is_optional_count,
                                  is_optional_text, is_positive, is_text, is_text_list, is_time, one_of, show)
from sessions.messages import ROLES, Message
from sessions.safetensors_payload import DTYPES, FLOAT_DTYPES, dtype_name
from sessions.saved_kv import FLOAT, FORMAT_KEYS, format_of, layer_tensors, meta_fields, read_format

if TYPE_CHECKING:
    from mlxcore import CacheCounters, CacheMeta

FORMAT = "mlxchat-session"
VERSION = 4  # the newest this reads: 2 added quantized KV caches, 3 the appending layout, 4 linear states
FLOAT_VERSION = 1  # float caches only (earlier mlxchats read it)
QUANTIZED_VERSION = 2  # quantized caches may appear
APPENDING_VERSION = 3  # the appending layout's header
HYBRID_VERSION = 4  # a hybrid model's linear-layer states may appear
KINDS = ("standard", "paged", "rotating")
ROLES_SAVED = ("target", "draft")


@dataclass(frozen=True)
class SavedLinear:
    """A hybrid model's linear-layer states in a saved cache: ``len(offsets)`` sets, each every linear layer's."""

    offsets: tuple[int, ...]  # the tokens each set had read, increasing; the last is the cache's own
    shapes: dict[str, tuple[str, tuple[int, ...]]]  # "<linear layer>.<part>" -> (safetensors dtype, shape)

    def tensor_shapes(self, role: str) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {f"{role}.linear.{n}.{key}": spec for n in range(len(self.offsets)) for key, spec in self.shapes.items()}


@dataclass(frozen=True)
class SavedCache:
    """One model's cache as the header describes it."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str  # safetensors name of the model's dtype: "F32", "F16", "BF16"
    tokens: tuple[int, ...]  # the ids the cache holds
    state: CacheCounters  # the kind's counters (paged: block_size; rotating: offset, high, window)
    kv_format: KVFormat = FLOAT  # how keys and values are stored (saved_kv.py)
    linear: SavedLinear | None = None  # a hybrid model's linear-layer states

    def tensor_shapes(self, kind: str, role: str) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Name -> (dtype, shape) of every tensor this cache must have in the payload."""
        linear = self.linear.tensor_shapes(role) if self.linear is not None else {}
        if kind == "rotating":
            length = min(self.state["high"], _window(self.state).slots)
        else:
            length = len(self.tokens)
        if not length:
            return linear
        layer = layer_tensors(self.kv_format, self.dtype, self.kv_heads, self.head_dim, length)
        return {f"{role}.{i}.{name}": spec for i in range(self.layers) for name, spec in layer.items()} | linear

    def meta(self, kind: str) -> CacheMeta:
        """The metadata ``ModelCache.from_state`` takes."""
        meta: CacheMeta = {"kind": kind, "tokens": list(self.tokens), **self.state, **meta_fields(self.kv_format)}
        if self.linear is not None:
            meta["linear"] = {"offsets": list(self.linear.offsets), "shapes": {
                key: (str(DTYPES[dtype][1]).rsplit(".", 1)[-1], list(shape))
                for key, (dtype, shape) in self.linear.shapes.items()}}
        return meta

    def geometry(self) -> KVGeometry:
        """The geometry of the model that saved it."""
        return KVGeometry(self.layers, self.kv_heads, self.head_dim, DTYPES[self.dtype][1], self.kv_format)

    def fits(self, geometry: KVGeometry) -> bool:
        return (self.layers, self.kv_heads, self.head_dim, self.dtype) == (
            geometry.num_layers, geometry.kv_heads, geometry.head_dim, dtype_name(geometry.dtype))


@dataclass(frozen=True)
class SavedSession:
    """Everything a session file's header says, checked."""

    version: int
    created: float  # seconds since the epoch
    updated: float
    title: str | None
    model_name: str
    model_fingerprint: str
    draft_name: str | None  # None: saved without a draft model
    draft_fingerprint: str | None
    params: GenerationParams
    enable_thinking: bool
    use_draft: bool
    system: str | None
    history: tuple[Message, ...]  # after the system prompt
    cache_kind: str
    target: SavedCache | None  # None: no cache saved
    draft: SavedCache | None

    def tensor_shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        shapes: dict[str, tuple[str, tuple[int, ...]]] = {}
        for role in self.roles:
            shapes |= self.cache(role).tensor_shapes(self.cache_kind, role)
        return shapes

    @property
    def roles(self) -> list[str]:
        """The roles ("target", "draft") whose caches are saved."""
        return [role for role in ROLES_SAVED if self.cache_or_none(role) is not None]

    def cache_or_none(self, role: str) -> SavedCache | None:
        return self.target if role == "target" else self.draft

    def cache(self, role: str) -> SavedCache:
        """The ``role`` cache, which the caller knows is saved (``roles``)."""
        cache = self.cache_or_none(role)
        assert cache is not None, f"no {role} cache is saved"
        return cache

    def fingerprint(self, role: str) -> str:
        """The fingerprint of the model whose ``role`` cache is saved."""
        fingerprint = self.model_fingerprint if role == "target" else self.draft_fingerprint
        assert fingerprint is not None, "the draft's cache is saved without a draft model"  # read_saved_session
        return fingerprint


# building -------------------------------------------------------------------------------------

def build_header(*, created: float, title: str | None, model: tuple[str, str], draft: tuple[str, str] | None,
                 params: GenerationParams, enable_thinking: bool, use_draft: bool, messages: list[Message],
                 kind: str, caches: dict[str, tuple[KVGeometry, CacheMeta]]) -> Header:
    """The header dict. ``caches`` maps "target"/"draft" to (geometry, ``state_dict`` metadata)."""
    system = messages[0].content if messages and messages[0].role == "system" else None
    history = messages[1:] if system is not None else messages
    quantized = any(format_of(meta).quantized for _, meta in caches.values())
    hybrid = any("linear" in meta for _, meta in caches.values())
    version = HYBRID_VERSION if hybrid else QUANTIZED_VERSION if quantized else FLOAT_VERSION
    return {
        "format": FORMAT, "version": version, "created": created,
        "updated": time.time(), "title": title,
        "model": {"name": model[0], "fingerprint": model[1]},
        "draft": {"name": draft[0], "fingerprint": draft[1]} if draft else None,
        "params": {f.name: list(v) if isinstance(v := getattr(params, f.name), tuple) else v
                   for f in fields(params) if f.name != "ignore_eos" or params.ignore_eos},  # (older readers
        # refuse a parameter they do not know: ignore_eos is written only where it is on)
        "enable_thinking": enable_thinking, "use_draft": use_draft, "system": system,
        "history": [m.as_dict() for m in history],
        "cache": {"kind": kind, "target": _cache_header(*caches["target"]) if "target" in caches else None,
                  "draft": _cache_header(*caches["draft"]) if "draft" in caches else None},
    }


def appending_version(header: Header) -> int:
    """The version a session file in the appending layout names for ``header`` (``build_header``'s)."""
    return HYBRID_VERSION if header["version"] == HYBRID_VERSION else APPENDING_VERSION


def _cache_header(geometry: KVGeometry, meta: CacheMeta) -> CacheHeader:
    described = ("kind", "tokens", "linear", *FORMAT_KEYS)  # said elsewhere in the header
    header: CacheHeader = {
        "layers": geometry.num_layers, "kv_heads": geometry.kv_heads, "head_dim": geometry.head_dim,
        "dtype": dtype_name(geometry.dtype), "kv_format": format_of(meta).name,
        "tokens": [int(t) for t in meta["tokens"]], "state": {k: v for k, v in meta.items() if k not in described}}
    if "linear" in meta:
        linear = meta["linear"]
        header["linear"] = {"offsets": list(linear["offsets"]), "shapes": {
            key: [dtype_name(getattr(mx, dtype)), list(shape)] for key, (dtype, shape) in linear["shapes"].items()}}
    return header


# reading --------------------------------------------------------------------------------------

def read_saved_session(data: object, where: str) -> SavedSession:
    """Check every field of a header dict; ``SessionFileError`` saying which is wrong."""
    top = Fields(data, where)
    version = _check_format(top, where)
    model = top.sub("model")
    draft = None if top.data.get("draft") is None else top.sub("draft")
    cache = top.sub("cache")
    kind = cache.get("kind", one_of(KINDS), f"one of {', '.join(KINDS)}")
    saved = SavedSession(
        version=version, created=top.get("created", is_time, "a time"),
        updated=top.get("updated", is_time, "a time"),
        title=top.get("title", is_optional_text, "text or null"),
        model_name=model.get("name", is_text, "text"), model_fingerprint=model.get("fingerprint", is_text, "text"),
        draft_name=draft.get("name", is_text, "text") if draft else None,
        draft_fingerprint=draft.get("fingerprint", is_text, "text") if draft else None,
        params=_read_params(top.sub("params"), where),
        enable_thinking=top.get("enable_thinking", is_bool, "true or false"),
        use_draft=top.get("use_draft", is_bool, "true or false"),
        system=top.get("system", is_optional_text, "text or null"),
        history=_read_history(top.get("history", is_list, "a list"), where),
        cache_kind=kind,
        target=_read_cache(cache, "target", kind, where), draft=_read_cache(cache, "draft", kind, where))
    if saved.draft is not None and saved.draft_fingerprint is None:
        raise SessionFileError(f"{where}: the header has a draft cache but no draft model.")
    caches = [c for c in (saved.target, saved.draft) if c is not None]
    if any(c.linear is not None and (c.linear.offsets[-1:] or (len(c.tokens),)) != (len(c.tokens),) for c in caches):
        raise SessionFileError(f"{where}: a cache's linear states and its tokens disagree: the file is inconsistent.")
    if version < HYBRID_VERSION and any(c.linear is not None for c in caches):
        raise SessionFileError(f"{where}: session format {version} holds no linear states, yet the header names "
                               "some: the file is inconsistent.")
    if version == FLOAT_VERSION and any(c.kv_format.quantized for c in caches):
        raise SessionFileError(f"{where}: session format {version} holds float caches only, yet the header "
                               "names a quantized one: the file is inconsistent.")
    return saved


def _check_format(top: Fields, where: str) -> int:
    """The header's format version, when this mlxchat reads it."""
    if top.data.get("format") != FORMAT:
        raise SessionFileError(f"{where}: not an mlxchat session (format {show(top.data.get('format'))}).")
    version = top.get("version", is_count, "a whole number")
    if version > VERSION:
        raise SessionFileError(f"{where} was saved by a newer mlxchat (session format {version}; this one "
                               f"reads {VERSION}): update mlxchat to open it.")
    if version < 1:
        raise SessionFileError(f"{where}: session format version {version} does not exist.")
    return version


def _read_params(params: Fields, where: str) -> GenerationParams:
    """The saved parameters; one the header leaves out (an older mlxchat's) keeps its default."""
    unknown = sorted(set(params.data) - {f.name for f in fields(GenerationParams)})
    if unknown:
        raise SessionFileError(f"{where}: unknown generation parameter {unknown[0]!r}.")
    p, d, number, count, optional = params, GenerationParams(), "a number", "a whole number", "a whole number or null"
    try:
        return GenerationParams(
            temperature=p.get_or("temperature", is_number, number, d.temperature),
            top_k=p.get_or("top_k", is_count, count, d.top_k),
            top_p=p.get_or("top_p", is_number, number, d.top_p),
            min_p=p.get_or("min_p", is_number, number, d.min_p),
            repetition_penalty=p.get_or("repetition_penalty", is_number, number, d.repetition_penalty),
            repetition_context=p.get_or("repetition_context", is_count, count, d.repetition_context),
            seed=p.get_or("seed", is_optional_count, optional, d.seed),
            max_tokens=p.get_or("max_tokens", is_optional_count, optional, d.max_tokens),
            stop=tuple(p.get_or("stop", is_text_list, "a list of text", list(d.stop))),
            prefill_chunk=p.get_or("prefill_chunk", is_optional_count, optional, d.prefill_chunk),  # null: device's
            ignore_eos=p.get_or("ignore_eos", is_bool, "true or false", d.ignore_eos))
    except (TypeError, ValueError) as error:
        raise SessionFileError(f"{where}: the saved generation parameters are invalid: {error}.") from None


_HISTORY_ROLES = tuple(role for role in ROLES if role != "system")


def _read_history(items: list[object], where: str) -> tuple[Message, ...]:
    history = []
    for number, item in enumerate(items, 1):
        message = Fields(item, where, f"message {number} of the history")
        role = message.get("role", one_of(_HISTORY_ROLES), "user, assistant or tool")
        history.append(Message(role, message.get("content", is_text, "text")))
    return tuple(history)


def _read_cache(cache: Fields, role: str, kind: str, where: str) -> SavedCache | None:
    if cache.data.get(role) is None:
        return None
    c = cache.sub(role)
    state = c.sub("state")
    head_dim = c.get("head_dim", is_positive, "a positive whole number")
    saved = SavedCache(
        layers=c.get("layers", is_positive, "a positive whole number"),
        kv_heads=c.get("kv_heads", is_positive, "a positive whole number"),
        head_dim=head_dim,
        dtype=c.get("dtype", one_of(FLOAT_DTYPES), f"one of {', '.join(FLOAT_DTYPES)}"),
        tokens=tuple(c.get("tokens", is_count_list, "a list of token ids")),
        state=_read_state(state, kind),
        kv_format=read_format(c.data.get("kv_format", FLOAT.name), head_dim, f"{where}: the {role} cache"),
        linear=None if c.data.get("linear") is None else _read_linear(c.sub("linear"), f"{where}: the {role} cache"))
    _check_state(saved, kind, f"{where}: the {role} cache")
    return saved


def _read_linear(linear: Fields, where: str) -> SavedLinear:
    """A hybrid cache's linear states: increasing offsets, and a float dtype and a shape per layer and part."""
    offsets = tuple(linear.get("offsets", is_count_list, "a list of token counts"))
    if list(offsets) != sorted(set(offsets)) or 0 in offsets:
        raise SessionFileError(f"{where}: its linear states' offsets {list(offsets)} do not increase.")
    shapes = {}
    for key, spec in linear.sub("shapes").data.items():
        if not (re.fullmatch(r"\d+\.[01]", key) and isinstance(spec, list) and len(spec) == 2
                and spec[0] in FLOAT_DTYPES and is_count_list(spec[1]) and all(spec[1])):
            raise SessionFileError(f"{where}: its linear state {show(key)} has no valid dtype and shape.")
        shapes[key] = (spec[0], tuple(spec[1]))
    return SavedLinear(offsets, shapes)


def _read_state(state: Fields, kind: str) -> CacheCounters:
    """The counters ``kind`` has (``CacheCounters``), each a whole number; others in the header are ignored."""
    def count(key: str) -> int:
        return state.get(key, is_count, "a whole number")
    if kind == "paged":
        return {"block_size": count("block_size")}
    if kind == "rotating":
        return {"offset": count("offset"), "high": count("high"), "max_size": count("max_size"),
                "keep": count("keep"), "max_rewind": count("max_rewind")}
    return {}


def _check_state(cache: SavedCache, kind: str, where: str) -> None:
    s = cache.state
    if kind == "paged" and s["block_size"] < 1:
        raise SessionFileError(f"{where} has a block size of 0.")
    if kind == "rotating":
        try:
            _window(s)
        except ValueError as error:
            raise SessionFileError(f"{where} has an impossible window: {error}") from None
        if s["offset"] != len(cache.tokens) or s["offset"] > s["high"]:
            raise SessionFileError(f"{where}: its offsets and its token count disagree.")


def _window(state: CacheCounters) -> Window:
    return Window(state["max_size"], state["keep"], state["max_rewind"])

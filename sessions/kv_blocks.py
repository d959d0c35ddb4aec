"""A model cache's saved state <-> stored blocks: which blocks it holds, the bytes of new ones, tensors back.

Standard and paged caches hold token i at position i, so their state is cut by
position into blocks of ``BLOCK_TOKENS`` tokens keyed by the chained hash of the
tokens (block_keys.py): a prefix shared between chats, forks and regenerations is
the same blocks, and a turn adds only the blocks its tokens fill. A rotating window
is one block holding its whole state: once it wraps, its slots depend on what was
evicted, which no token prefix names (and the window bounds its size anyway).

A hybrid model's cache (Qwen3.5) adds its linear layers' states, a fixed size whatever
the tokens: a block per set of them (the cache's own, and its snapshots) after the
others, holding every linear layer's state (no tokens), keyed like a window by its bytes
and salted with the tokens the set had read, so a snapshot kept from an earlier save is
the same block again.

A block's payload (``mlxcore/kv/block_frame.py``, the pool's disk tier writes the same):
the number of tokens (u32), their ids (u32 each), then each state tensor's slice for
those tokens in name order, raw little-endian, shaped (1, kv_heads, n, width). Only ``state_dict()`` of the cache is used, so any kind
that follows ``ModelCache`` is stored the same way, and a quantized cache's blocks
hold its packed words, scales and biases as the pool stores them (saved_kv.py),
under keys salted with its format.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from mlxcore import ModelCache
from mlxcore import KVGeometry
from mlxcore import block_payload
from sessions.block_keys import BlockRef, chain_keys, layout_salt, token_bytes, tokens_from, window_key
from sessions.block_files import BlockFileError
from sessions.errors import SessionFileError
from sessions.file_header import SavedSession
from sessions.safetensors_payload import DTYPES, Words, dtype_name, from_words, raw_words
from sessions.saved_kv import format_of
from sessions.store_index import StoredBlock

if TYPE_CHECKING:
    from mlxcore import CacheMeta

WINDOW_KINDS = ("rotating",)
LINEAR = "linear."  # a hybrid cache's linear states: tensors "linear.<set>.<layer>.<part>" (mlxcore's HybridCache)
Layout = dict[str, tuple[str, tuple[int, ...]]]  # tensor name -> (dtype name, shape with -1 for the tokens)


@dataclass
class CacheBlocks:
    """One cache's state cut into blocks; ``payloads`` encodes the ones asked for."""

    geometry: KVGeometry
    meta: CacheMeta  # state_dict's metadata (the header describes the cache with it)
    refs: list[BlockRef]
    rows: list[StoredBlock]  # what the index records, in order
    _tensors: dict[str, mx.array]
    _window: bytes | None  # a rotating cache's one payload
    _linear: dict[str, bytes] = field(default_factory=dict)  # a hybrid cache's linear-state sets: key -> payload
    _encoded: dict[str, bytes] | None = None  # every payload, once ``encode_all`` ran

    def payloads(self, keys: Iterable[str]) -> dict[str, bytes]:
        """key -> payload for the blocks among ``keys`` (the ones the store does not have yet)."""
        keys = set(keys)
        if self._encoded is not None:
            return {ref.key: self._encoded[ref.key] for ref in self.refs if ref.key in keys}
        linear = {key: payload for key, payload in self._linear.items() if key in keys}
        wanted = [ref for ref in self.refs if ref.key in keys and ref.key not in self._linear]
        if not wanted:
            return linear
        if self._window is not None:
            return {wanted[0].key: self._window} | linear
        tokens, first, last = self.meta["tokens"], wanted[0].start, wanted[-1].end
        names = sorted(self._tensors)
        tails = [self._tensors[name][:, :, first:last, :] for name in names]
        mx.eval(tails)  # one pass over a paged gather for every slice
        words = [raw_words(tail) for tail in tails]
        return {ref.key: _payload(tokens[ref.start:ref.end],
                                  (w[:, :, ref.start - first:ref.end - first, :] for w in words))
                for ref in wanted} | linear


    def encode_all(self) -> None:
        """Encode every block now; later ``payloads`` calls only look them up (no MLX)."""
        self._encoded = self.payloads(ref.key for ref in self.refs)


def cache_blocks(cache: ModelCache, ids: list[int], fingerprint: str, role: str) -> CacheBlocks:
    """The blocks of ``cache``, holding the first of ``ids`` (of the model with ``fingerprint``, as ``role``)."""
    return state_blocks(cache.geometry, *cache.state_dict(ids), fingerprint, role)


def state_blocks(geometry: KVGeometry, tensors: dict[str, mx.array], meta: CacheMeta, fingerprint: str,
                 role: str) -> CacheBlocks:
    """The blocks of a cache's ``state_dict`` (over several ranks: ``Engine.cache_state``'s, every head)."""
    tokens = [int(t) for t in meta["tokens"]]
    states = {name: a for name, a in tensors.items() if name.startswith(LINEAR)}
    tensors = {name: a for name, a in tensors.items() if name not in states}
    layout = {name: (dtype_name(a.dtype), (*a.shape[:2], -1, *a.shape[3:])) for name, a in tensors.items()}
    fmt = format_of(meta).name
    if meta["kind"] in WINDOW_KINDS:
        salt = layout_salt(fingerprint, role, "window", layout, fmt)
        window = _payload(tokens, (raw_words(tensors[name]) for name in sorted(tensors)))
        refs = [BlockRef(window_key(salt, window), 0, len(tokens))]
    else:
        refs, window = chain_keys(layout_salt(fingerprint, role, "positional", layout, fmt), tokens), None
    linear = {}
    for n, offset in enumerate(meta["linear"]["offsets"] if "linear" in meta else []):
        own = {name.removeprefix(f"{LINEAR}{n}."): a for name, a in states.items() if name.startswith(f"{LINEAR}{n}.")}
        payload = _payload([], (raw_words(own[name]) for name in sorted(own)))
        layout = {name: (dtype_name(a.dtype), tuple(a.shape)) for name, a in own.items()}
        linear[window_key(_linear_salt(fingerprint, role, layout, offset), payload)] = payload
    refs = [*refs, *(BlockRef(key, len(tokens), len(tokens)) for key in linear)]
    rows = [StoredBlock(ref.key, token_bytes(tokens[ref.start:ref.end])) for ref in refs]
    return CacheBlocks(geometry, meta, refs, rows, tensors, window, linear)


def tensors_from_blocks(saved: SavedSession, role: str, rows: Sequence[StoredBlock],
                        read: Callable[[str], bytes], where: str) -> dict[str, mx.array]:
    """The state tensors of ``saved``'s ``role`` cache (named "<role>.<layer>.<name>") from its blocks.

    Every block's key is recomputed from the header and the tokens (so a block of
    another chat, model or position is refused), and its token ids must match.
    """
    cache = saved.cache(role)
    shapes = _kv_shapes(saved, role)
    tokens = list(cache.tokens)
    salt = _salt(saved, role, shapes)
    sets = len(cache.linear.offsets) if cache.linear is not None else 0
    if sets:
        rows, linear = rows[:-sets], _read_linear(saved, role, rows[-sets:], read, where)
    else:
        linear = {}
    if saved.cache_kind in WINDOW_KINDS:
        refs = [BlockRef(rows[0].key, 0, len(tokens))] if rows and shapes else []
    else:
        refs = chain_keys(salt, tokens) if shapes else []
    if [ref.key for ref in refs] != [row.key for row in rows]:
        raise SessionFileError(f"{where}: the index lists other {role} cache blocks than its tokens need "
                               "(the index is damaged).")
    arrays = {name: np.empty(shape, DTYPES[dtype][0]) for name, (dtype, shape) in shapes.items()}
    for ref in refs:
        payload = read(ref.key)
        if saved.cache_kind in WINDOW_KINDS and window_key(salt, payload) != ref.key:
            raise BlockFileError(f"{where}: its stored {role} window does not match its key.", ref.key)
        _fill(arrays, payload, tokens, ref, saved.cache_kind in WINDOW_KINDS, f"{where}: {role} block {ref.key}")
    return {name: from_words(array, shapes[name][0]) for name, array in arrays.items()} | linear


def _read_linear(saved: SavedSession, role: str, rows: Sequence[StoredBlock], read: Callable[[str], bytes],
                 where: str) -> dict[str, mx.array]:
    """A hybrid cache's linear-state sets, a block each (``rows``, in the header's order), their keys checked."""
    linear = saved.cache(role).linear
    assert linear is not None, "states are read only for a cache that has them"
    if len(rows) != len(linear.offsets):
        raise SessionFileError(f"{where}: the index lists fewer blocks than the {role} cache's linear states "
                               "(the index is damaged).")
    tensors: dict[str, mx.array] = {}
    for n, (row, offset) in enumerate(zip(rows, linear.offsets)):
        payload = read(row.key)
        if window_key(_linear_salt(saved.fingerprint(role), role, linear.shapes, offset), payload) != row.key:
            raise BlockFileError(f"{where}: its stored {role} linear states do not match their key.", row.key)
        arrays = {name: np.empty(shape, DTYPES[dtype][0]) for name, (dtype, shape) in linear.shapes.items()}
        _fill(arrays, payload, [], BlockRef(row.key, 0, 0), True, f"{where}: {role} block {row.key}")
        tensors |= {f"{role}.{LINEAR}{n}.{name}": from_words(array, linear.shapes[name][0])
                    for name, array in arrays.items()}
    return tensors


def _kv_shapes(saved: SavedSession, role: str) -> Layout:
    """The ``role`` cache's tensors that its token blocks hold (its linear states, if any, have blocks of their own)."""
    return {name: spec for name, spec in saved.cache(role).tensor_shapes(saved.cache_kind, role).items()
            if not name.startswith(f"{role}.{LINEAR}")}


def _linear_salt(fingerprint: str, role: str, layout: Layout, offset: int) -> bytes:
    """A linear-state set's salt: the model, the role, its tensors ("<layer>.<part>") and the tokens it had read,
    so that a block of another model or point is refused."""
    return layout_salt(fingerprint, role, f"linear {offset}", layout)


def saved_keys(saved: SavedSession, role: str, payloads: Sequence[bytes]) -> list[str]:
    """The keys of ``saved``'s ``role`` cache blocks as ``tensors_from_blocks`` checks them, for blocks that
    hold ``payloads`` in order (a session file's index names blocks by place, not by key)."""
    cache = saved.cache(role)
    shapes = _kv_shapes(saved, role)
    salt = _salt(saved, role, shapes)
    linear = []
    if cache.linear is not None and cache.linear.offsets:  # the linear-state sets' blocks are the last
        count = len(cache.linear.offsets)
        linear = [window_key(_linear_salt(saved.fingerprint(role), role, cache.linear.shapes, offset), payload)
                  for offset, payload in zip(cache.linear.offsets, payloads[-count:])]
        payloads = payloads[:-count]
    if saved.cache_kind in WINDOW_KINDS:
        return [window_key(salt, payload) for payload in payloads] + linear
    return ([ref.key for ref in chain_keys(salt, cache.tokens)] if shapes else []) + linear


def _salt(saved: SavedSession, role: str, shapes: Layout) -> bytes:
    family = "window" if saved.cache_kind in WINDOW_KINDS else "positional"
    layout = {name[len(role) + 1:]: (dtype, (*shape[:2], -1, *shape[3:])) for name, (dtype, shape) in shapes.items()}
    return layout_salt(saved.fingerprint(role), role, family, layout, saved.cache(role).kv_format.name)


def _payload(tokens: Sequence[int], parts: Iterable[Words]) -> bytes:
    return block_payload(tokens, (part.tobytes() for part in parts))


def _fill(arrays: dict[str, Words], payload: bytes, tokens: list[int], ref: BlockRef, whole: bool,
          where: str) -> None:
    """Copy one block's slices into ``arrays`` (names in order), checking its ids and its size."""
    count = struct.unpack("<I", payload[:4])[0] if len(payload) >= 4 else -1
    if count != ref.end - ref.start or tokens_from(payload[4:4 + 4 * count]) != tokens[ref.start:ref.end]:
        raise BlockFileError(f"{where} holds other tokens than the chat.", ref.key)
    offset = 4 + 4 * count
    for name in sorted(arrays):
        target = arrays[name] if whole else arrays[name][:, :, ref.start:ref.end, :]
        size = target.size * target.itemsize
        if offset + size > len(payload):
            raise BlockFileError(f"{where} is shorter than its tensors.", ref.key)
        target[...] = np.frombuffer(payload, target.dtype, target.size, offset).reshape(target.shape)
        offset += size
    if offset != len(payload):
        raise BlockFileError(f"{where} is longer than its tensors.", ref.key)

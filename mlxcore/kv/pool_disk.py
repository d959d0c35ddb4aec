"""One block pool's view of the disk tier (``disk_tier.py``): its blocks' keys, their bytes out and back in.

A key names the model (its fingerprint), the KV format (float, "q8g32"...), the block size and the layout,
then the block's chained hash (``block_manager.chain_hash``: its tokens and every token before them), so
blocks of other models, tokenizers, formats or block sizes never meet. The payload is the session store's
(``block_frame.py``), the tensors as the pool stores them. Reading back checks the token ids and every size:
a block that does not fit is a miss.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np
import numpy.typing as npt

from mlxcore.kv import stored
from mlxcore.kv.block_frame import block_payload, block_tokens
from mlxcore.kv.block_manager import chain_hash
from mlxcore.kv.disk_tier import DiskTier
from mlxcore.kv.errors import PoolExhaustedError

if TYPE_CHECKING:
    from mlxcore.kv.paged import PagedCache
    from mlxcore.kv.paged_pool import BlockPool

STORAGE_VERSION = 1  # part of every key: a change of the encoding starts new keys
Leaving = tuple[int, bytes, tuple[int, ...]]  # (block id, chained hash, token ids) of a block leaving memory
Words = npt.NDArray[np.float32 | np.float16 | np.uint16 | np.uint32]  # one tensor of a block, as stored
_NUMPY = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16, mx.uint32: np.uint32}


class ReadOrCompute:
    """Whether reading a prompt's blocks back beats computing them: seconds a token of each, measured here
    (moving averages); until both are measured, read (docs/kv-disk.md, "Only when reading is faster")."""

    MIN_TOKENS = 64  # fewer tokens time mostly a step's fixed costs: not a measure of either
    WEIGHT = 0.3  # of the newest measure in the average

    def __init__(self) -> None:
        self.read_seconds: float | None = None  # per token read back
        self.compute_seconds: float | None = None  # per prompt token computed

    def timed_read(self, tokens: int, seconds: float) -> None:
        self.read_seconds = self._average(self.read_seconds, tokens, seconds)

    def timed_compute(self, tokens: int, seconds: float) -> None:
        self.compute_seconds = self._average(self.compute_seconds, tokens, seconds)

    @property
    def read_pays(self) -> bool:
        return self.read_seconds is None or self.compute_seconds is None or self.read_seconds < self.compute_seconds

    def _average(self, old: float | None, tokens: int, seconds: float) -> float | None:
        if tokens < self.MIN_TOKENS or seconds <= 0:
            return old
        new = seconds / tokens
        return new if old is None else (1 - self.WEIGHT) * old + self.WEIGHT * new


class PoolDisk:
    """The disk tier as one pool's blocks see it."""

    def __init__(self, tier: DiskTier, pool: BlockPool, fingerprint: str, role: str = "target") -> None:
        self.tier, self.pool, self.role = tier, pool, role
        g, names = pool.geometry, stored.tensor_names(pool.geometry.format)
        half = len(names) // 2
        # (layer, keys 0 or values 1, part) of each tensor, in the order of its name ("<layer>.<name>")
        self.order = [(layer, index // half, index % half) for _, layer, index in
                      sorted((f"{layer}.{name}", layer, index) for layer in range(g.num_layers)
                             for index, name in enumerate(names))]
        described = {"storage": STORAGE_VERSION, "model": fingerprint, "kv_format": g.format.name,
                     "block_size": pool.block_size, "layers": g.num_layers, "kv_heads": g.kv_heads,
                     "head_dim": g.head_dim, "dtype": str(g.dtype)}
        self.salt = hashlib.blake2b(json.dumps(described, sort_keys=True).encode(), digest_size=20).digest()
        self.hit_tokens = 0  # prompt tokens read back from disk instead of computed
        self.pace = ReadOrCompute()

    def key(self, chained: bytes) -> str:
        return hashlib.blake2b(self.salt + chained, digest_size=20).hexdigest()

    def save(self, leaving: Sequence[Leaving]) -> None:
        """Hand the blocks leaving memory (their storage still holds them) to the tier's writer, those it
        lacks; the bytes are read here, on the engine's thread, the disk is written on the tier's."""
        todo = [(block_id, key, tokens) for block_id, chained, tokens in leaving
                if not self.tier.has(key := self.key(chained))]
        if not todo or self.tier.stopped is not None:
            return
        size, storage = self.pool.block_size, self.pool.storage
        # The slabs as they are now: slicing may run the garbage collector, whose finalizer of a dropped cache
        # may give this pool's free slabs back meanwhile (the arrays stay valid, the lists change).
        slabs = [list(layer.slabs) for layer in storage]
        slices = []
        for block_id, _, _ in todo:
            slab, at = storage[0].where(block_id * size)
            slices.append([slabs[layer][slab][part][side:side + 1, :, at:at + size, :]
                           for layer, side, part in self.order])
        mx.eval(slices)
        for (_, key, tokens), arrays in zip(todo, slices):
            self.tier.put(key, block_payload(tokens, (_raw(a) for a in arrays)))

    def read_into(self, cache: PagedCache, ids: Sequence[int], reused: int) -> int:
        """After a memory hit of ``reused`` tokens: the blocks of ``ids`` that follow, found on disk, written
        into ``cache`` (never the last token: it is computed); the tokens read."""
        size = self.pool.block_size
        limit = (len(ids) - 1) // size * size
        if reused >= limit or not self.pace.read_pays:
            return 0
        began = time.perf_counter()
        parent = None
        for start in range(0, reused, size):
            parent = chain_hash(parent, ids[start:start + size])
        found: list[list[Words]] = []
        for start in range(reused, limit, size):
            chunk = tuple(ids[start:start + size])
            parent = chain_hash(parent, chunk)
            data = self.tier.read(self.key(parent))
            arrays = self._decode(data, chunk) if data is not None else None
            if arrays is None:
                break
            found.append(arrays)
        if not found:
            return 0
        count = len(found) * size
        try:
            cache.begin(count)
        except PoolExhaustedError:
            return 0  # no room for them: the prompt is computed as without the tier
        joined = [mx.array(np.concatenate([block[n] for block in found], axis=2)) for n in range(len(self.order))]
        joined = [a.view(mx.bfloat16) if self.pool.geometry.dtype == mx.bfloat16 and a.dtype == mx.uint16 else a
                  for a in joined]
        for layer in cache.layers:  # each layer's tensors in ``tensor_names`` order: keys' parts, then values'
            parts = sorted((side, part, n) for n, (at, side, part) in enumerate(self.order) if at == layer.index)
            cache.write_stored(layer, [joined[n] for _, _, n in parts])
        mx.eval([s.arrays for s in self.pool.storage])
        cache.hash_blocks(ids)
        seconds = time.perf_counter() - began
        self.pace.timed_read(count, seconds)
        cache.disk_read_tokens, cache.disk_read_seconds = count, seconds
        self.hit_tokens += count
        if self.role == "target":  # the tier counts a prompt's tokens once (a draft reads the same ones)
            self.tier.hit_tokens += count
        return count

    def _decode(self, data: bytes, chunk: tuple[int, ...]) -> list[Words] | None:
        """A payload's tensors (in ``order``), or None when it holds other tokens or other sizes."""
        head = block_tokens(data)
        if head is None or tuple(head[0]) != chunk:
            return None
        offset, arrays = head[1], []
        parts = self.pool.storage[0].parts()
        for _, _, part in self.order:
            (heads, width), dtype = parts[part]
            kind = np.dtype(_NUMPY[dtype])
            count = heads * len(chunk) * width
            if offset + count * kind.itemsize > len(data):
                return None
            arrays.append(np.frombuffer(data, kind, count, offset).reshape(1, heads, len(chunk), width))
            offset += count * kind.itemsize
        return arrays if offset == len(data) else None


def _raw(array: mx.array) -> bytes:
    """An evaluated array's bytes (bfloat16 as its 16-bit words: numpy has no bfloat16)."""
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    return np.ascontiguousarray(np.array(array)).tobytes()

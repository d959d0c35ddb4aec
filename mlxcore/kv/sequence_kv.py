"""What attention reads for one paged sequence: its keys and values in token order, without a per-step copy.

A decode step must not copy the whole sequence (at 8k tokens on an 8B model that
is a gigabyte per token). Two cases, per layer:

- The sequence's blocks are adjacent in storage (a lone chat; after a trim or a
  regenerate, since the block manager hands a sequence the block after its last
  one): attention reads a view (slice) of the pool's storage. Nothing is copied.
- They are not (a fork, a prefix hit, a restored session: shared blocks, then the
  sequence's own; a chat that crosses from one of the pool's slabs into the next):
  attention reads a **working copy**, a contiguous array of the sequence's tokens.
  It is gathered from the blocks once, then grows by the same appends as the
  blocks, like mlx-lm's ``KVCache``, so a step writes one token twice and copies
  nothing else. A trim only shortens what is read; it is
  dropped only when it cannot be trusted (``reuse_prefix``, ``release``).

The blocks stay the truth (sharing, hashes, copy-on-write, session files); the
working copy is a cache of them that costs memory only while a fragmented
sequence lives (``nbytes``).

Measured on 8 layers of the 8B's geometry (8 KV heads x 128, float32) at 2,000
tokens on the CPU, write + read + attention per step, interleaved: a view of
larger storage took 0.98x the time of a contiguous array, two slices
concatenated per step 3.4x. Per decode step against mlx-lm's ``KVCache``: a
forked table (two runs) went from 0.41x its speed (gathered every step) to
1.0-1.07x in two runs; a fresh one stayed at 1.0x. The bench rows
``paged_decode_vs_standard_long`` and ``_twin`` measure it through the engine.

Several sequences at once: each sequence's reads are independent
(``SequenceKV.read`` per sequence and layer), so a batched step can project
queries, keys and values for all sequences together and attend per sequence on
these contiguous arrays.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.kv.slab_storage import Gather, LayerStorage

WORKING_STEP = 256  # a working copy grows by this many token slots at a time (as mlx-lm's KVCache)


def working_bytes(length: int, token_bytes: int) -> int:
    """The most bytes the working copies of a ``length``-token sequence hold, all layers (``token_bytes`` each)."""
    return (length // WORKING_STEP + 1) * WORKING_STEP * token_bytes


class _WorkingCopy:
    """One layer's keys and values in token order; rows ``0 .. valid`` are the sequence's tokens."""

    def __init__(self, keys: mx.array, values: mx.array, valid: int) -> None:
        self.keys, self.values, self.valid = keys, values, valid  # (1, kv_heads, capacity, head_dim)

    def append(self, start: int, keys: mx.array, values: mx.array) -> None:
        """Write (1, kv_heads, L, head_dim) at rows ``start .. start + L`` (``start <= valid``)."""
        end = start + keys.shape[2]
        if end > self.keys.shape[2]:
            grown = -(-end // WORKING_STEP) * WORKING_STEP
            shape = (*self.keys.shape[:2], grown - start, self.keys.shape[3])
            self.keys = mx.concatenate([self.keys[..., :start, :], mx.zeros(shape, keys.dtype)], axis=2)
            self.values = mx.concatenate([self.values[..., :start, :], mx.zeros(shape, values.dtype)], axis=2)
        self.keys[..., start:end, :] = keys
        self.values[..., start:end, :] = values
        self.valid = end

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class SequenceKV:
    """The per-layer reads of one paged sequence (see the module docstring)."""

    def __init__(self, num_layers: int) -> None:
        self._copies: list[_WorkingCopy | None] = [None] * num_layers

    def wrote(self, index: int, start: int, keys: mx.array, values: mx.array) -> None:
        """Layer ``index`` just wrote keys/values (1, kv_heads, L, head_dim) for tokens ``start ..`` into its blocks."""
        copy = self._copies[index]
        if copy is None:
            return
        if copy.valid < start:  # a gap: rows it never saw; rebuilt on the next read
            self._copies[index] = None
            return
        copy.append(start, keys, values)

    def read(self, index: int, storage: LayerStorage, gather: Gather, length: int) -> tuple[mx.array, mx.array]:
        """The first ``length`` tokens of layer ``index``, each (1, kv_heads, length, head_dim), contiguous rows."""
        if not gather.runs or length <= gather.runs[0][2]:
            # Adjacent blocks: a view. A working copy made earlier is kept (and appended to): a speculative
            # round that crosses into a block elsewhere and is trimmed back would otherwise rebuild it each time.
            return storage.fetch(gather, length)
        copy = self._copies[index]
        if copy is None or copy.valid < length:
            keys, values = storage.gather(gather, length, spare=WORKING_STEP - length % WORKING_STEP)
            copy = self._copies[index] = _WorkingCopy(keys, values, length)
        return copy.keys[..., :length, :], copy.values[..., :length, :]

    def clear(self) -> None:
        """Forget every working copy (the sequence's tokens changed other than by appends and trims)."""
        self._copies = [None] * len(self._copies)

    @property
    def nbytes(self) -> int:
        """Bytes of the working copies held now (none while the sequence's blocks are adjacent)."""
        return sum(copy.nbytes for copy in self._copies if copy is not None)

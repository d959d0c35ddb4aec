"""Tensor-free bookkeeping of the paged KV cache: blocks, block tables, prefix hashes.

A pool of ``num_blocks`` blocks of ``block_size`` token slots each. Every
sequence has a block table (its block ids in order) and its length; the ids of
its tokens are its owner's. ``append`` makes room for tokens; once their ids are
known and their keys and values written, the owner hands the ids to
``hash_blocks``, and every full block among them gets a chained hash (parent
block's hash + its own token ids). The hash -> block dict is the prefix cache,
so a sequence with the same leading tokens attaches those blocks instead of
recomputing them.

Free blocks wait in one ordered dict that is also the eviction order: blocks
without a hash (nothing worth keeping) at the front, hashed blocks at the back
in the order they were freed. A sequence frees its blocks tail first, so the
head of a prompt (the part most likely shared) is evicted last. Ids never used
yet sit between the two: the pool hands out storage lazily, but fills it up to
its capacity before it evicts cached prefixes. One exception keeps a sequence's
blocks adjacent in storage, so attention reads them as few views (one per run
of adjacent blocks, ``decode_attention.py``): a sequence that needs another block takes the one right
after its last when that one is free or never used, evicting what it caches only
when that continues the same prefix (after a trim or a regenerate, the sequence's
own old tail), never another prompt's cached block (its chain would be cut).

The three checks nano-vllm learnt the hard way: reusing a block removes its hash
entry only if the entry still points at that block; a prefix hit never covers
the last token (the model must compute at least one); a freed block revived by a
hit keeps its hash.

No MLX here: ``append`` returns an ``AppendPlan`` that says which blocks to copy
(copy-on-write) and which slots to write; ``paged.py`` does the tensor work.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from mlxcore.kv.errors import CacheStateError, PoolExhaustedError, TrimError, UnknownSequenceError


def chain_hash(parent: bytes | None, token_ids: Sequence[int]) -> bytes:
    """The hash of a full block: its parent's hash (None for the first block) and its token ids."""
    digest = hashlib.blake2b(parent or b"", digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


@dataclass
class Block:
    """One physical block: who uses it and, once full, which tokens it holds."""

    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # chained hash; set when the block fills, kept after free
    token_ids: tuple[int, ...] = ()  # the tokens behind ``hash``, compared on a prefix hit
    parent: bytes | None = None  # the hash of the block before it in its chain (None: a chain's first)
    trimmed_from: _Sequence | None = None  # the sequence whose trim freed it (its own old tail), until taken


@dataclass(frozen=True)
class WriteSegment:
    """Appended tokens ``source .. source + length`` go to storage slots ``slot .. slot + length``."""

    slot: int  # block_id * block_size + position inside the block
    length: int
    source: int


@dataclass(frozen=True)
class AppendPlan:
    """What storage must do for one ``append``: copy blocks, then write the new tokens."""

    start: int  # tokens the sequence held before the append
    length: int  # tokens appended
    copies: tuple[tuple[int, int], ...]  # (source block, destination block), copy-on-write
    segments: tuple[WriteSegment, ...]
    new_blocks: int  # blocks the table grew by (0: the tokens fit its tail block)


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of the pool for metrics."""

    used_blocks: int  # blocks some sequence holds
    cached_blocks: int  # free blocks that still hold a hashed prefix
    prefix_hit_tokens: int  # tokens attached by prefix hits since the pool was made


@dataclass
class _Sequence:
    block_ids: list[int] = field(default_factory=list)
    length: int = 0  # tokens held (slots written or announced)


class _Tables(dict[int, _Sequence]):
    """Sequence id -> its block table; an unknown id is ``UnknownSequenceError`` (read several times a decode
    step: a plain dict lookup, no helper call)."""

    def __missing__(self, seq_id: int) -> _Sequence:
        raise UnknownSequenceError(f"The KV pool holds no sequence {seq_id}.")


class BlockManager:
    """Block pool, block tables and prefix cache of one model; see the module docstring."""

    def __init__(self, block_size: int, num_blocks: int) -> None:
        if block_size < 1 or num_blocks < 1:
            raise ValueError("block_size and num_blocks must be at least 1.")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._blocks: list[Block] = []  # materialized blocks; id == index
        self._free: OrderedDict[int, None] = OrderedDict()  # eviction order, front first
        self._by_hash: dict[bytes, int] = {}
        self._sequences = _Tables()
        self._next_sequence = 0
        self._prefix_hit_tokens = 0
        # Full blocks evicted or shrunk away since the pool last looked (id, hash, tokens), for its disk tier;
        # None: nobody keeps them (no tier), so nothing is collected.
        self.leaving: list[tuple[int, bytes, tuple[int, ...]]] | None = None

    # sequences -----------------------------------------------------------

    def new_sequence(self) -> int:
        """Register an empty sequence; return its id."""
        seq_id = self._next_sequence
        self._next_sequence += 1
        self._sequences[seq_id] = _Sequence()
        return seq_id

    def fork(self, seq_id: int) -> int:
        """A new sequence sharing every block of ``seq_id`` (copy-on-write of its partial tail)."""
        source = self._sequences[seq_id]
        for block_id in source.block_ids:
            self._blocks[block_id].ref_count += 1
        child = self.new_sequence()
        self._sequences[child] = _Sequence(list(source.block_ids), source.length)
        return child

    def release(self, seq_id: int) -> None:
        """Give back every block of ``seq_id``, tail first; the sequence stays, empty."""
        seq = self._sequences[seq_id]
        self._free_tail(seq, len(seq.block_ids))
        seq.length = 0

    def drop_sequence(self, seq_id: int) -> None:
        """Release ``seq_id`` and forget it; unknown ids are ignored (used by finalizers)."""
        if seq_id in self._sequences:
            self.release(seq_id)
            del self._sequences[seq_id]

    def length(self, seq_id: int) -> int:
        return self._sequences[seq_id].length

    def block_ids(self, seq_id: int) -> list[int]:
        return self._sequences[seq_id].block_ids

    # growing and shrinking -------------------------------------------------

    def cached_prefix(self, token_ids: Sequence[int]) -> tuple[int, int]:
        """What ``reuse_prefix`` would attach for ``token_ids``, changing nothing: (tokens, of its blocks
        those that are free now, so attaching them takes them from ``available_blocks``)."""
        tokens = free = 0
        for block_id, _ in self._cached_blocks(token_ids):
            tokens += self.block_size
            free += self._blocks[block_id].ref_count == 0
        return tokens, free

    def _cached_blocks(self, token_ids: Sequence[int]) -> Iterator[tuple[int, tuple[int, ...]]]:
        """(block id, its token ids) of the cached full blocks that start ``token_ids``, never its last token."""
        parent: bytes | None = None
        for start in range(0, (len(token_ids) - 1) // self.block_size * self.block_size, self.block_size):
            chunk = tuple(token_ids[start:start + self.block_size])
            parent = chain_hash(parent, chunk)
            block_id = self._by_hash.get(parent)
            if block_id is None or self._blocks[block_id].token_ids != chunk:
                return
            yield block_id, chunk

    def reuse_prefix(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Attach the cached full blocks that start ``token_ids``; return the tokens attached.

        Only on an empty sequence. Never covers the last token, so the caller
        always has at least one token to compute.
        """
        seq = self._sequences[seq_id]
        if seq.length:
            raise CacheStateError("reuse_prefix needs an empty cache.")
        for block_id, chunk in list(self._cached_blocks(token_ids)):
            self._attach(seq, block_id, chunk)
        reused = seq.length
        self._prefix_hit_tokens += reused
        return reused

    def append(self, seq_id: int, count: int, make_room: Callable[[int], None] | None = None) -> AppendPlan:
        """Make room for ``count`` more tokens of the sequence; raise ``PoolExhaustedError`` (changing nothing)
        if they do not fit. ``make_room(blocks)`` runs first when they need blocks (the pool's budget decides
        how many it may hand out: ``BlockPool.make_room``). The blocks they fill are found by prefix hits only
        after ``hash_blocks``."""
        seq = self._sequences[seq_id]
        if count < 1:
            raise ValueError("append needs at least one token.")
        start, size = seq.length, self.block_size
        tail = self._blocks[seq.block_ids[-1]] if start % size else None  # a partial tail block
        tail_shared = tail is not None and tail.ref_count > 1
        needed = -(-(start + count) // size) - len(seq.block_ids) + tail_shared  # ``blocks_needed``, read here
        if not needed:  # (most appends fill the tail block: nothing to count, one place to write)
            assert tail is not None  # the tokens fit a partial tail block
            if tail.hash is not None:  # (a partial tail has one only after a trim)
                self._unhash(tail)  # its tail slots are about to change
            seq.length += count
            return AppendPlan(start, count, (), (WriteSegment(seq.block_ids[-1] * size + start % size, count, 0),), 0)
        if make_room is not None:
            make_room(needed)
        if needed > self.available_blocks:
            raise PoolExhaustedError(
                f"The KV block pool is full: {count} more tokens need {needed} blocks, "
                f"{self.available_blocks} are free. Free a session or raise the pool size.")
        copies, blocks = self._prepare_tail(seq, tail_shared) if tail is not None else (), len(seq.block_ids)
        segments = self._place(seq, start, count)
        seq.length += count
        return AppendPlan(start, count, copies, segments, len(seq.block_ids) - blocks)

    def hash_blocks(self, seq_id: int, token_ids: Sequence[int], held: int | None = None) -> None:
        """Hash the sequence's full blocks among its first ``held`` tokens (default: all), whose ids start
        ``token_ids``: prefix hits may find them from now on. Blocks hashed before are left as they are."""
        seq = self._sequences[seq_id]
        size = self.block_size
        full = min(len(token_ids), seq.length if held is None else min(held, seq.length)) // size
        first = full
        while first and self._blocks[seq.block_ids[first - 1]].hash is None:
            first -= 1
        parent = self._blocks[seq.block_ids[first - 1]].hash if first else None
        for index in range(first, full):
            block = self._blocks[seq.block_ids[index]]
            chunk = tuple(token_ids[index * size:(index + 1) * size])
            block.hash, block.token_ids, block.parent = chain_hash(parent, chunk), chunk, parent
            self._by_hash[block.hash] = block.block_id
            parent = block.hash

    def blocks_needed(self, seq_id: int, count: int) -> int:
        """Blocks an append of ``count`` tokens takes (new ones, and a copy of a shared partial tail)."""
        seq = self._sequences[seq_id]
        start, size = seq.length, self.block_size
        tail_shared = start % size != 0 and self._blocks[seq.block_ids[-1]].ref_count > 1
        return -(-(start + count) // size) - len(seq.block_ids) + tail_shared

    def free_tail_start(self, cached: bool) -> int:
        """The first id of the run of free blocks at the end of the ids handed out (hashed ones only if ``cached``)."""
        end = len(self._blocks)
        while end and self._blocks[end - 1].ref_count == 0 and (cached or self._blocks[end - 1].hash is None):
            end -= 1
        return end

    def shrink(self, keep: int) -> None:
        """Forget blocks ``keep ..`` (all free): their ids count as never handed out again."""
        for block in self._blocks[keep:]:
            assert block.ref_count == 0, "shrink past a block in use"
            self._evict(block)
            del self._free[block.block_id]
        del self._blocks[keep:]

    def trim(self, seq_id: int, n: int) -> None:
        """Remove the last ``n`` tokens, releasing blocks that no longer hold any."""
        seq = self._sequences[seq_id]
        if not 0 <= n <= seq.length:
            raise TrimError(f"Cannot trim {n} tokens from a sequence of {seq.length}.")
        seq.length -= n
        keep_blocks = -(-seq.length // self.block_size)
        for block_id in seq.block_ids[keep_blocks:]:
            self._blocks[block_id].trimmed_from = seq
        self._free_tail(seq, len(seq.block_ids) - keep_blocks)

    # metrics -------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        """Blocks handed out before and free now (cached prefixes included)."""
        return len(self._free)

    @property
    def available_blocks(self) -> int:
        """Blocks an append may still take: free ones plus ids never handed out."""
        return len(self._free) + self.num_blocks - len(self._blocks)

    @property
    def used_blocks(self) -> int:
        """Blocks some sequence holds now (``stats().used_blocks``, without counting the cached ones)."""
        return len(self._blocks) - len(self._free)

    @property
    def materialized_blocks(self) -> int:
        """Blocks ever handed out; storage must hold this many."""
        return len(self._blocks)

    def held_hashed(self) -> list[tuple[int, bytes, tuple[int, ...]]]:
        """The full blocks sequences still hold (id, hash, tokens), as ``leaving`` lists them: for a disk tier
        that keeps them before the process ends."""
        return [(block.block_id, block.hash, block.token_ids) for block in self._blocks
                if block.ref_count > 0 and block.hash is not None and self._by_hash.get(block.hash) == block.block_id]

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def stats(self) -> PoolStats:
        cached = sum(1 for b in self._free if self._blocks[b].hash is not None)
        return PoolStats(self.used_blocks, cached, self._prefix_hit_tokens)

    # internals -------------------------------------------------------------

    def _attach(self, seq: _Sequence, block_id: int, chunk: tuple[int, ...]) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]  # revived: it keeps its hash
        block.ref_count += 1
        seq.block_ids.append(block_id)
        seq.length += len(chunk)

    def _allocate(self, after: int | None = None, seq: _Sequence | None = None) -> int:
        """Take a block: the one after ``after`` if free or never used (see the module docstring),
        else a free unhashed one, else a fresh id, else evict the oldest cached prefix."""
        front = next(iter(self._free), None)
        if after is not None and after + 1 in self._free and self._continues(after, self._blocks[after + 1], seq):
            front = after + 1
            del self._free[front]
            self._evict(self._blocks[front])
        elif after is not None and after + 1 == len(self._blocks) < self.num_blocks:
            front = len(self._blocks)
            self._blocks.append(Block(front))
        elif front is not None and self._blocks[front].hash is None:
            del self._free[front]
        elif len(self._blocks) < self.num_blocks:
            front = len(self._blocks)
            self._blocks.append(Block(front))
        else:
            assert front is not None, "append checked available_blocks"
            del self._free[front]
            self._evict(self._blocks[front])
        self._blocks[front].ref_count, self._blocks[front].trimmed_from = 1, None
        return front

    def _continues(self, after: int, block: Block, seq: _Sequence | None) -> bool:
        """Whether free ``block`` may follow block ``after`` in ``seq``'s table: it caches nothing, or it is
        the sequence's own old tail (freed by its trim, or continuing ``after``'s tokens: a regenerated
        reply). Another prompt's cached block stays: taking it would cut its chain, whose later blocks no
        hit could reach."""
        return (block.hash is None or (seq is not None and block.trimmed_from is seq)
                or (block.parent is not None and block.parent == self._blocks[after].hash))

    def _evict(self, block: Block) -> None:
        """A free block is reused or forgotten: its cached prefix leaves memory (``leaving`` records it)."""
        if self.leaving is not None and block.hash is not None and self._by_hash.get(block.hash) == block.block_id:
            self.leaving.append((block.block_id, block.hash, block.token_ids))
        self._unhash(block)

    def _unhash(self, block: Block) -> None:
        # Another block may own this hash by now (same tokens written twice): leave its entry alone.
        if block.hash is not None and self._by_hash.get(block.hash) == block.block_id:
            del self._by_hash[block.hash]
        block.hash, block.token_ids, block.parent = None, (), None

    def _free_tail(self, seq: _Sequence, count: int) -> None:
        for _ in range(count):
            block = self._blocks[seq.block_ids.pop()]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = None
                if block.hash is None:
                    self._free.move_to_end(block.block_id, last=False)

    def _prepare_tail(self, seq: _Sequence, shared: bool) -> tuple[tuple[int, int], ...]:
        """Make the partial tail block writable: copy it if shared, drop its stale hash if not."""
        tail = seq.block_ids[-1]
        if not shared:
            if self._blocks[tail].hash is not None:  # (a partial tail has one only after a trim)
                self._unhash(self._blocks[tail])  # its tail slots are about to change
            return ()
        self._blocks[tail].ref_count -= 1
        copy = self._allocate(seq.block_ids[-2] if len(seq.block_ids) > 1 else None, seq)
        seq.block_ids[-1] = copy
        return ((tail, copy),)

    def _place(self, seq: _Sequence, start: int, length: int) -> tuple[WriteSegment, ...]:
        size, segments, done = self.block_size, [], 0
        while done < length:
            position = start + done
            if position % size == 0:
                seq.block_ids.append(self._allocate(seq.block_ids[-1] if seq.block_ids else None, seq))
            run = min(size - position % size, length - done)
            slot = seq.block_ids[position // size] * size + position % size
            segments.append(WriteSegment(slot, run, done))
            done += run
        return tuple(segments)

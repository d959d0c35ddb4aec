"""The caches one conversation owns: the target's, the draft's when speculative decoding is on, and the ids
(and a block drafter's context).

``ids`` is the one list of the conversation's token ids: each cache holds the
first ``offset`` of them (the draft's may be fewer), and the list may run on past
them (a token picked and not fed yet, a prompt being read). While a batched
reply runs on the caches, its ``Sequence.ids`` is this same list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlxcore.kv.base import ModelCache

if TYPE_CHECKING:
    from mlxcore.block_drafter import BlockContext


@dataclass
class Caches:
    target: ModelCache
    draft: ModelCache | None = None
    ids: list[int] = field(default_factory=list)
    # A block drafter's context: its keys and values of the target's hidden states (``block_drafter.py``)
    context: BlockContext | None = None

    @property
    def offset(self) -> int:
        """Tokens the target's cache holds."""
        return self.target.offset

    @property
    def tokens(self) -> list[int]:
        """Token ids the target's cache holds (a copy)."""
        return self.ids[:self.target.offset]

    def hash_blocks(self) -> None:
        """Tell both caches the ids (``ModelCache.hash_blocks``): their full blocks become prefix hits."""
        self.target.hash_blocks(self.ids)
        if self.draft is not None:
            self.draft.hash_blocks(self.ids)

    def fork(self) -> Caches:
        """Independent caches holding the same tokens (paged: sharing blocks)."""
        return Caches(self.target.fork(), self.draft.fork() if self.draft else None, self.tokens,
                      self.context.fork() if self.context else None)

    def release(self) -> None:
        """Give both caches back, what they held kept for prefix hits under ``ids`` (``ModelCache.release``),
        and the block drafter's context."""
        self.target.release(self.ids)
        if self.draft:
            self.draft.release(self.ids)
        self.ids = []
        if self.context is not None:
            self.context.drop()  # its bytes back to the KV budget
        self.context = None

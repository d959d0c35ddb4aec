"""The caches one conversation owns: the target's, and the draft's when speculative decoding is on."""

from __future__ import annotations

from dataclasses import dataclass

from mlxcore.kv.base import ModelCache


@dataclass
class Caches:
    target: ModelCache
    draft: ModelCache | None = None

    @property
    def offset(self) -> int:
        """Tokens the target's cache holds."""
        return self.target.offset

    @property
    def tokens(self) -> list[int]:
        """Token ids the target's cache holds."""
        return self.target.tokens

    def fork(self) -> Caches:
        """Independent caches holding the same tokens (paged: sharing blocks)."""
        return Caches(self.target.fork(), self.draft.fork() if self.draft else None)

    def release(self) -> None:
        self.target.release()
        if self.draft:
            self.draft.release()

    @property
    def nbytes(self) -> int:
        return self.target.nbytes + (self.draft.nbytes if self.draft else 0)

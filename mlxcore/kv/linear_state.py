"""The recurrent state of one linear-attention layer (Gated DeltaNet: Qwen3.5, Qwen3-Next) for one sequence.

mlx-lm's layer reads and writes ``cache[0]`` (the convolution's last inputs) and ``cache[1]`` (one matrix
per value head), then calls ``advance``, as with its ``ArraysCache``; ``lengths`` is None for one sequence
without padding. The state keeps its size whatever the sequence's length, and it cannot be rewound: the
tokens it has read are folded into it. So ``trim`` takes back nothing but zero tokens.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.kv.errors import TrimError

class LinearState:
    """One linear layer's state for one sequence; follows mlx-lm's ``ArraysCache(size=2)`` where its layer reads it."""

    lengths = None  # one sequence, no padding: mlx-lm's layer then keeps the last inputs as they are

    def __init__(self, arrays: tuple[mx.array | None, mx.array | None] = (None, None), offset: int = 0) -> None:
        self._arrays: list[mx.array | None] = list(arrays)
        self.offset = offset  # tokens read (kept in step with the attention layers' lengths)

    def __getitem__(self, index: int) -> mx.array | None:
        return self._arrays[index]

    def __setitem__(self, index: int, value: mx.array) -> None:
        self._arrays[index] = value

    def advance(self, n: int) -> None:
        self.offset += n

    def make_mask(self, N: int) -> None:
        """One sequence without padding reads every position."""
        return None

    def is_trimmable(self) -> bool:
        return False

    def trim(self, n: int) -> int:
        if n:
            raise TrimError(f"A linear-attention layer's state cannot be rewound by {n} tokens.")
        return 0

    def clear(self) -> None:
        """Forget every token read (an empty sequence)."""
        self._arrays, self.offset = [None, None], 0

    def restore(self, saved: LinearState) -> None:
        """Take ``saved``'s state (a ``copy`` made earlier) as this sequence's again."""
        self._arrays, self.offset = list(saved._arrays), saved.offset

    def copy(self) -> LinearState:
        """The same state for another sequence (MLX arrays are never written in place, so they are shared)."""
        return LinearState((self._arrays[0], self._arrays[1]), self.offset)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays if a is not None)

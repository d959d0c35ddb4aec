"""How keys and values are stored: in the model's float dtype, or quantized to 8 bits.

Quantized: each token's key and value vectors are quantized along the head
dimension in groups (``group_size`` numbers share a scale and a bias), as
``mx.quantize`` does, so attention reads them with ``mx.quantized_matmul``
without dequantizing the sequence (scores: queries x keys transposed; output:
weights x values). 4 bits is refused: its accuracy against the float cache is too low
(docs/decisions.md, "Quantized KV: 8 bits, not 4").
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcore.kv.errors import KVCacheError

SUPPORTED_BITS = (8,)  # 4 did not keep answers (see the module docstring)
GROUP_SIZES = (64, 32)  # the largest that divides the head size is used (mx.quantize's sizes)


class KVFormatError(KVCacheError):
    """A KV format this model's cache cannot take (bits, or a head size no group size divides)."""


@dataclass(frozen=True)
class KVFormat:
    """Float (``bits`` None) or quantized keys and values."""

    bits: int | None = None
    group_size: int = 64

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    @property
    def name(self) -> str:
        """For block hashes and session files: float and quantized blocks never mix."""
        return "float" if self.bits is None else f"q{self.bits}g{self.group_size}"

    def token_bytes(self, kv_heads: int, head_dim: int, dtype_size: int) -> int:
        """Bytes of one token's keys and values in one layer."""
        if self.bits is None:
            return 2 * kv_heads * head_dim * dtype_size
        groups = head_dim // self.group_size
        return 2 * kv_heads * (head_dim * self.bits // 8 + 2 * groups * dtype_size)


def kv_format(bits: int | None, head_dim: int) -> KVFormat:
    """The format for ``bits`` (None: float) on heads of ``head_dim``; ``KVFormatError`` if it cannot be."""
    if bits is None:
        return KVFormat()
    if bits not in SUPPORTED_BITS:
        raise KVFormatError(f"A {bits}-bit KV cache is not supported: use kv_bits=8 (4 bits did not keep "
                            "answers close enough to the float cache's).")
    for group in GROUP_SIZES:
        if head_dim % group == 0:
            return KVFormat(bits, group)
    raise KVFormatError(f"A quantized KV cache needs a head size divisible by {' or '.join(map(str, GROUP_SIZES))}; "
                        f"this model's heads have {head_dim}.")

"""``exp`` built from multiplies and adds, for prefill on MLX's x86 CPU backend.

There MLX computes ``exp`` and ``sigmoid`` one element at a time, ~15-20 ns
each, while a multiply or an add over the same array costs ~0.3 ns an element.
Attention's softmax and SwiGLU's SiLU make those two functions most of a
prefill once OpenBLAS does the matrix products (``benchmarks/prefill_parts.py``).
Range reduction plus a Taylor polynomial gets the same values (relative error
~1e-7, float32 rounding) from a dozen cheap whole-array operations.
"""

from __future__ import annotations

import math

import mlx.core as mx

# exp(x) = 2**n * exp(r) with n = round(x / ln 2) and |r| <= ln(2) / 2. ln 2 is split in two
# (the high part has few significant bits, so n * _LN2_HIGH is exact in float32) to keep r accurate.
_LN2_HIGH = 0.693359375
_LN2_LOW = math.log(2) - _LN2_HIGH
# Taylor terms 1/k! for k = 7..2: at |r| <= 0.35 the first term left out is below 1e-8 of exp(r).
_TAYLOR = tuple(1 / math.factorial(k) for k in range(7, 1, -1))
# Adding 1.5 * 2**23 to a float32 rounds it to an integer (floor and round are slow calls here) and
# leaves that integer in the low bits of the sum: the sum's bits minus _ROUNDER_BITS are n.
_ROUNDER = 1.5 * 2**23
_ROUNDER_BITS = 0x4B400000
# Inputs are clipped here: exp stays a normal float32 (no denormals, no overflow). Softmax and
# sigmoid, the only callers, cannot tell exp(-80) ~ 2e-35 from 0 next to terms of size ~1.
_LIMIT = 80.0


def fast_exp(x: mx.array) -> mx.array:
    """``exp(x)`` for float32 ``x``, clipped to [exp(-80), exp(80)]."""
    x = mx.clip(x, -_LIMIT, _LIMIT)
    rounded = x * (1 / math.log(2)) + _ROUNDER
    n = rounded - _ROUNDER
    r = (x - n * _LN2_HIGH) - n * _LN2_LOW
    p = _TAYLOR[0]
    for c in _TAYLOR[1:]:
        p = p * r + c
    p = (p * r + 1.0) * r + 1.0
    # 2**n: n + 127 in the exponent field of a float32
    two_to_n = mx.left_shift(rounded.view(mx.int32) + (127 - _ROUNDER_BITS), 23).view(mx.float32)
    return p * two_to_n


def fast_softmax(x: mx.array) -> mx.array:
    """Softmax over the last axis; rows must hold at least one finite value."""
    e = fast_exp(x - mx.max(x, axis=-1, keepdims=True))
    return e / mx.sum(e, axis=-1, keepdims=True)


def fast_silu(x: mx.array) -> mx.array:
    """``x * sigmoid(x)``."""
    return x / (1.0 + fast_exp(-x))

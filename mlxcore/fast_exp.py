"""``exp`` built from multiplies and adds, for prefill on MLX's x86 CPU backend.

There MLX computes ``exp`` and ``sigmoid`` one element at a time, many times
the cost of a multiply or an add over the same array (docs/decisions.md,
"Prefill on the CPU: fast_exp", has the figures).
Attention's softmax and SwiGLU's SiLU make those two functions most of a
prefill once OpenBLAS does the matrix products (``bench/studies/prefill_parts.py``).
Range reduction plus a Taylor polynomial gets the same values (relative error
~1e-7, float32 rounding) from a dozen cheap whole-array operations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import mlx.core as mx

from mlxcore.compile_support import compile_works

# exp(x) = 2**n * exp(r) with n = round(x / ln 2) and |r| <= ln(2) / 2. ln 2 is split in two
# (the high part has few significant bits, so n * _LN2_HIGH is exact in float32) to keep r accurate.
_LN2_HIGH = 0.693359375
_LN2_LOW = math.log(2) - _LN2_HIGH
# Taylor terms 1/k! for k = 7..2: at |r| <= 0.35 the first term left out is below 1e-8 of exp(r).
_TAYLOR = tuple(1 / math.factorial(k) for k in range(7, 1, -1))
# Adding then subtracting 1.5 * 2**23 rounds a float32 to an integer (floor and round are slow calls here).
_ROUNDER = 1.5 * 2**23
# Inputs are clipped here: exp stays a normal float32 (no denormals, no overflow). Softmax and
# sigmoid, the only callers, cannot tell exp(-80) ~ 2e-35 from 0 next to terms of size ~1.
_LIMIT = 80.0


def _exp_parts(x: mx.array) -> tuple[mx.array, mx.array]:
    """exp(x) = p * 2**n: p, and the bits of the float32 2**n as int32."""
    x = mx.clip(x, -_LIMIT, _LIMIT)
    rounded = x * (1 / math.log(2)) + _ROUNDER
    n = rounded - _ROUNDER
    r = (x - n * _LN2_HIGH) - n * _LN2_LOW
    p = _TAYLOR[0] * r + _TAYLOR[1]
    for c in _TAYLOR[2:]:
        p = p * r + c
    p = (p * r + 1.0) * r + 1.0
    # 2**n: n + 127 in the exponent field of a float32
    return p, mx.left_shift(n.astype(mx.int32) + 127, 23)


@lru_cache(maxsize=1)
def _parts() -> Callable[[mx.array], tuple[mx.array, mx.array]]:
    """``_exp_parts`` fused into one kernel where MLX can compile (one pass over memory, not ~25);
    shapeless, so every shape shares it. The final view stays outside: it cannot be shapeless."""
    return mx.compile(_exp_parts, shapeless=True) if compile_works() else _exp_parts


def _shifted_parts(x: mx.array, top: mx.array) -> tuple[mx.array, mx.array]:
    return _exp_parts(x - top)


@lru_cache(maxsize=1)
def exp_below_parts() -> Callable[[mx.array, mx.array], tuple[mx.array, mx.array]]:
    """``_exp_parts(x - top)`` in one kernel (the subtraction too: one operation fewer for softmax)."""
    return mx.compile(_shifted_parts, shapeless=True) if compile_works() else _shifted_parts


def fast_exp(x: mx.array) -> mx.array:
    """``exp(x)`` for float32 ``x``, clipped to [exp(-80), exp(80)]."""
    p, bits = _parts()(x)
    return p * bits.view(mx.float32)


def fast_exp_below(x: mx.array, top: mx.array) -> mx.array:
    """``exp(x - top)`` (``top`` broadcast against ``x``, e.g. its row maxima), as ``fast_exp``."""
    p, bits = exp_below_parts()(x, top)
    return p * bits.view(mx.float32)


def warm_up() -> None:
    """Build the fused kernel now (on Linux the first build runs the C++ compiler for seconds)."""
    for shape in ((2,), (1, 1, 2), (1, 1, 1, 1, 2)):  # SiLU's and attention's number of axes
        mx.eval(fast_exp(mx.zeros(shape)))
    for scores in ((1, 1, 1, 2), (1, 1, 1, 1, 2)):  # decode attention's scores, against their row maxima
        mx.eval(fast_exp_below(mx.zeros(scores), mx.zeros(scores[:-1] + (1,))))


def fast_softmax(x: mx.array) -> mx.array:
    """Softmax over the last axis; rows must hold at least one finite value."""
    e = fast_exp(x - mx.max(x, axis=-1, keepdims=True))
    return e / mx.sum(e, axis=-1, keepdims=True)


def fast_silu(x: mx.array) -> mx.array:
    """``x * sigmoid(x)``."""
    return x / (1.0 + fast_exp(-x))

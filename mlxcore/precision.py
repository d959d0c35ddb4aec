"""Full float32 matrix products, on every device, unless the user asks otherwise.

MLX runs float32 matrix products as TF32 by default where the hardware has it (``MLX_ENABLE_TF32``: CUDA GPUs,
and Apple's M5-class GPUs), about 1e-3 relative. A batch's rows, a verification's k + 1 rows and a lone
reply's row then take kernels that round differently, and a float32 model's greedy tokens part: batched
would no longer equal alone, nor speculative equal plain. On an H200 with TF32 on, the reference tests failed
on the embedded pair's float32 weights; with it off, those passed (docs/cuda.md).

Quantized and bf16 models run no float32 products, so the users' models lose nothing. MLX reads the variable
at its first product: this runs with the BLAS preload, before ``mlx.core`` is imported.
"""

from __future__ import annotations

import os

VARIABLE = "MLX_ENABLE_TF32"


def keep_float32_products() -> None:
    """Turn MLX's TF32 off for this process, unless the environment already says which it wants."""
    os.environ.setdefault(VARIABLE, "0")

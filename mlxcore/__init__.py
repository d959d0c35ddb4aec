"""mlxchat's MLX backend: models, KV caches, sampling, plain and speculative decoding."""

from mlxcore.blas import preload_optimized_blas

preload_optimized_blas()  # must run before mlx.core is imported anywhere

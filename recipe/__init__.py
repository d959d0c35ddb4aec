"""Recipe that builds mlxchat's embedded demonstration models from scratch.

`python -m recipe build` generates a synthetic chat corpus, trains a byte-level
BPE tokenizer on it, trains a Qwen3-architecture target and draft with PyTorch,
and exports them in the MLX layout under ``assets/models/``.
`python -m recipe evaluate` measures them on held-out generated tasks.
"""

"""Row `twin_prefill_vs_mlx_lm`: prefill time of a 2,000-token prompt on the 8B twin, mlx-lm / ours.

The 8B twin has the real model's 36 layers, 8 KV heads of 128 and 32 query
heads, so its prefill is mostly attention, the part that grows with the context.
mlx-lm's side is what ``mlx_lm.generate_step`` does with a prompt: the model's
own forward over chunks of ``prefill_step_size`` (2,048) tokens into mlx-lm's
``KVCache``, evaluating the cache after each chunk. Ours is ``mlxcore.prefill``
into the Engine's default (paged) cache in our default chunks. Neither side
computes logits (mlx-lm's are left unevaluated), and both run with the same BLAS
and every BLAS thread.

The float32 twin, not the 4-bit one the users run: on a Mac both run on Metal,
where this code path is not taken; on this CPU our layers' ``fast_exp`` applies to
float32 only, and the 4-bit twin's bfloat16 attention would time MLX's bfloat16
CPU kernels, the same on both sides.
"""

from __future__ import annotations

import time

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.device_profile import current
from bench.timing import paired_median
from mlxcore.blas import parallel_products
from mlxcore.engine import Engine
from mlxcore.loading import load_model
from mlxcore.prefill import prefill
from bench.twins import twin_folder

MLX_LM_PREFILL_STEP = 2048  # generate_step's default prefill_step_size


def twin_prefill_vs_mlx_lm(runs: int, tokens: int = 2000, twin: str = "qwen3-8b") -> dict:
    """mlx-lm's prefill seconds / ours for the same ``tokens`` prompt tokens, paired and alternated."""
    loaded = load_model(str(twin_folder(twin, bits=None)))
    model = loaded.model
    engine = Engine(model, loaded.tokenizer)
    chunk = current().prefill_chunk
    ids = [(i * 7919) % model.args.vocab_size for i in range(tokens)]  # content does not change the cost

    def ours(count: int = tokens) -> float:
        cache = engine.new_caches().target
        start = time.perf_counter()
        prefill(engine.target_forward, cache, ids[:count], chunk)
        return time.perf_counter() - start

    def theirs(count: int = tokens) -> float:
        cache = make_prompt_cache(model)
        prompt = mx.array(ids[:count])
        start = time.perf_counter()
        with parallel_products(), mx.stream(generation_stream):
            while prompt.size:  # generate_step's prefill loop
                model(prompt[:MLX_LM_PREFILL_STEP][None], cache=cache)
                mx.eval([c.state for c in cache])
                prompt = prompt[MLX_LM_PREFILL_STEP:]
                mx.clear_cache()
        return time.perf_counter() - start

    ours(min(256, tokens)), theirs(min(256, tokens))  # warm up both paths (kernels, buffers) on a short prompt
    result = paired_median(theirs, ours, runs)  # mlx-lm's side first: ratio = its seconds / ours
    return {"value": result["ratio"], "mlx_lm_s": result["ours"], "ours_s": result["theirs"],
            "ratios": result["ratios"], "tokens": tokens, "chunk": chunk, "mlx_lm_step": MLX_LM_PREFILL_STEP,
            "model": f"{twin} twin, float32", "kv": engine.kv.kind}

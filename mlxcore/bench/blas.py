"""Row `blas_speedup`: prefill time with the bundled reference BLAS / with the optimized one (Linux).

Which BLAS MLX uses is fixed when ``mlx.core`` is first imported, so each side
runs in its own subprocess (``python -m mlxcore.bench.prefill_probe``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys


def _probe(model_ref: str, tokens: int, repeats: int, reference: bool) -> dict:
    env = dict(os.environ, MLXCHAT_BLAS="reference" if reference else "auto")
    out = subprocess.run([sys.executable, "-m", "mlxcore.bench.prefill_probe", model_ref, str(tokens), str(repeats)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def blas_speedup(model_ref: str, tokens: int = 512, repeats: int = 3) -> dict:
    if sys.platform != "linux":
        return {"value": None, "note": "only Linux bundles a reference BLAS"}
    fast = _probe(model_ref, tokens, repeats, reference=False)
    slow = _probe(model_ref, tokens, repeats, reference=True)
    if not fast["blas"]:
        return {"value": None, "note": "no optimized BLAS found: apt-get install libopenblas0-pthread"}
    fast_s, slow_s = statistics.median(fast["seconds"]), statistics.median(slow["seconds"])
    return {"value": slow_s / fast_s, "optimized_seconds": fast_s, "reference_seconds": slow_s,
            "blas": fast["blas"], "prompt_tokens": tokens, "model": model_ref}

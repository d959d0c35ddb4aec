"""Row `blas_speedup`: prefill time with the bundled reference BLAS / with the optimized one (Linux).

Which BLAS MLX uses is fixed when ``mlx.core`` is first imported, so each side
runs in its own subprocess (``python -m bench.prefill_probe``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _probe(model_ref: str, tokens: int, repeats: int, reference: bool) -> dict:
    env = dict(os.environ, MLXCHAT_BLAS="reference" if reference else "auto")
    out = subprocess.run([sys.executable, "-m", "bench.prefill_probe", model_ref, str(tokens), str(repeats)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def blas_speedup(model_ref: str, lengths: tuple[int, ...] = (128, 256, 512), headline: int = 256,
                 repeats: int = 3) -> dict:
    """The ratio at ``headline`` prompt tokens (a typical first turn); the other lengths alongside.

    Only matrix products use BLAS; MLX's CPU attention and element-wise work do
    not, so the ratio shrinks as attention's share grows with the prompt.
    """
    if sys.platform != "linux":
        return {"value": None, "note": "only Linux bundles a reference BLAS"}
    result: dict = {"blas": None}
    for tokens in lengths:
        fast = _probe(model_ref, tokens, repeats, reference=False)
        if not fast["blas"]:
            return {"value": None, "note": "no optimized BLAS found: apt-get install libopenblas0-pthread"}
        slow = _probe(model_ref, tokens, repeats, reference=True)
        fast_s, slow_s = min(fast["seconds"]), min(slow["seconds"])
        result[f"ratio_{tokens}"] = slow_s / fast_s
        result[f"seconds_{tokens}"] = [round(fast_s, 4), round(slow_s, 4)]
        result["blas"] = fast["blas"]
    result["value"] = result[f"ratio_{headline}"]
    result["headline_tokens"], result["repeats"] = headline, repeats
    return result

"""The optimized BLAS: loaded before MLX, every thread for prefill's products, one for decode's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import mlxcore.blas as blas
from mlxcore.engine import Engine, KVConfig
from mlxcore.params import GenerationParams
from tiny_models import tiny_qwen3

needs_openblas = pytest.mark.skipif(blas.blas_threads() is None, reason="OpenBLAS is not installed here")

PROBE = ("import json, mlxcore.blas as b; "
         "print(json.dumps([b.loaded_library, b.blas_threads(), b._threads and b._threads[2]]))")


def _probe(**env: str) -> list:
    out = subprocess.run([sys.executable, "-c", PROBE], env=dict(os.environ, **env), capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


@needs_openblas
@pytest.mark.parametrize("kind", ["paged", "standard"])
def test_a_prompt_is_read_on_every_thread_and_decoded_on_one(kind, monkeypatch):
    """A prompt read alone, as rows of the batched pass (on the paged pool or a standard cache), runs its
    products on every thread; decode steps, and whatever comes after, on one."""
    model = tiny_qwen3()
    engine = Engine(model, None, kv=KVConfig(kind=kind))
    layer, during = engine.target_forward._layers[0], []
    monkeypatch.setattr(layer, "before_rows", lambda *args, real=layer.before_rows: during.append(
        blas.blas_threads()) or real(*args))  # the first layer of a prompt's pass
    assert blas.blas_threads() == 1
    events = list(engine.generate(list(range(40)), engine.new_caches(), GenerationParams(max_tokens=4,
                                                                                          prefill_chunk=16)))
    assert events[-1].stats.generated_tokens == 4
    assert during == [blas._threads[2]] * 3  # 39 tokens read (the last is decoded) in three passes: every thread
    assert blas.blas_threads() == 1  # after a whole reply too


@needs_openblas
def test_thread_count_from_the_environment_is_the_parallel_one():
    library, now, every = _probe(OPENBLAS_NUM_THREADS="2")
    assert library is not None and (now, every) == (1, 2)


def test_reference_blas_is_left_alone():
    library, now, every = _probe(MLXCHAT_BLAS="reference")
    assert (library, now, every) == (None, None, None)


def test_parallel_products_on_the_reference_blas_computes_right_and_leaves_threads_alone():
    """With no thread control (the bundled BLAS), prefill's products still run inside, and give numpy's result."""
    out = subprocess.run([sys.executable, "-c", REFERENCE_PRODUCT], env=dict(os.environ, MLXCHAT_BLAS="reference"),
                         capture_output=True, text=True, check=True)
    threads, error = json.loads(out.stdout)
    assert threads == [None, None, None]  # before, inside, after
    assert error < 1e-4


REFERENCE_PRODUCT = """
import json
import numpy as np
import mlxcore.blas as b
import mlx.core as mx
a = np.random.default_rng(0).standard_normal((96, 64), dtype=np.float32)
threads = [b.blas_threads()]
with b.parallel_products():
    threads.append(b.blas_threads())
    product = np.array(mx.array(a) @ mx.array(a.T))
threads.append(b.blas_threads())
print(json.dumps([threads, float(np.abs(product - a @ a.T).max() / np.abs(a @ a.T).max())]))
"""

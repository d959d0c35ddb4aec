"""What compiling a decode step's whole layer stack as one graph would buy (issue 58's call goal).

The engine runs each layer as two compiled halves with the cache's write and attention between them in
Python (``batching/batch_forward.py``): about four project calls and a few dozen MLX operations a layer
are built again for every token. This study runs a lone greedy reply on a model's own weights two ways and
compares, per token, the wall time and the CPU time of the thread that builds the graphs (Python and MLX's
graph building; the computation runs on MLX's own threads):

- ``engine``: ``Engine.generate`` on a paged cache, the product's path;
- ``stack``: a prototype, not the product: the keys and values of each layer in one contiguous buffer, the
  step's 28 layers compiled as one function (``mx.compile``), traced again only when the read length
  crosses a bucket of ``BUCKET`` tokens. Each layer attends over a window of its buffer padded to the
  bucket (a mask hides what is not held) and over its new token's own key, combined in one softmax, so the
  graph never writes what it reads; the new keys and values are written after the step, into buffers no
  pending graph reads.

Both take the same greedy tokens (checked). Run from the project's root:
``BUCKET=256 .venv/bin/python bench/studies/whole_stack.py [TWIN] [TOKENS]`` (TWIN: a name of
``bench/twin_specs.py``, or ``mini`` for the embedded target).

What it leaves out, and why that matters: the prototype waits for each step's keys and values before
writing them (a write into a buffer that a pending graph still reads would copy the buffer), so it cannot
build the next step while this one computes, as the engine does; and every read is padded to its bucket.
Both are what a whole-stack graph over MLX arrays costs without a kernel that reads and writes blocks in
place (figures and the reading: docs/engine.md, "A whole-stack graph").
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import mlxcore  # noqa: E402,F401  (OpenBLAS before MLX)
import mlx.core as mx  # noqa: E402

from mlxcore.compiled_forward import _FusedLayer  # noqa: E402
from mlxcore.engine import Engine, KVConfig  # noqa: E402
from mlxcore.events import TokenEvent  # noqa: E402
from mlxcore.fast_exp import exp_below_parts  # noqa: E402
from mlxcore.loading import load_model  # noqa: E402
from mlxcore.params import GenerationParams  # noqa: E402

BUCKET = int(os.environ.get("BUCKET", "256"))  # read lengths are padded to a multiple of this: one trace a bucket
PROMPT = list(range(5, 40))


class WholeStack:
    """A lone reply's decode steps as one compiled graph over per-layer key and value buffers."""

    def __init__(self, model, capacity: int) -> None:
        inner = model.model
        self.layers = [_FusedLayer(layer, compiled=False) for layer in inner.layers]
        self.embed, lm_head = inner.embed_tokens, None if model.args.tie_word_embeddings else model.lm_head
        self.norm = inner.norm
        self.head = (lambda h: inner.embed_tokens.as_linear(inner.norm(h))) if lm_head is None else \
            (lambda h: lm_head(inner.norm(h)))
        attn = inner.layers[0].self_attn
        self.kv_heads, self.heads = attn.n_kv_heads, attn.n_heads
        dim = inner.layers[0].self_attn.k_proj.weight.shape[0] // self.kv_heads
        self.buffers = [mx.zeros((2, self.kv_heads, capacity, dim)) for _ in self.layers]
        self.length = 0
        self.step_fn = mx.compile(self._step)

    def _step(self, ids: mx.array, where: mx.array, valid: mx.array, *windows: mx.array):
        x = self.embed(ids[:, None])  # (1, 1, hidden)
        news = []
        for layer, window in zip(self.layers, windows):
            q, both = layer.before_batch(x, where)  # (1, heads, 1, dim) scaled; (2, kv_heads, 1, dim)
            dim = q.shape[-1]
            rows = q.reshape(1, self.kv_heads, self.heads // self.kv_heads, dim)
            old = rows @ window[0][None].swapaxes(-1, -2)  # (1, kv, rep, bucket)
            old = mx.where(valid, old, -mx.inf)
            new = (rows * both[0][None]).sum(-1, keepdims=True)  # (1, kv, rep, 1)
            top = mx.maximum(old.max(-1, keepdims=True), new)
            p, bits = exp_below_parts()(old, top)
            weights = p * bits.view(mx.float32)
            own = mx.exp(new - top)
            out = (weights @ window[1][None] + own * both[1][None]) / (weights.sum(-1, keepdims=True) + own)
            x = layer.after_final(x, out.reshape(1, self.heads, 1, dim))
            news.append(both)
        return self.head(x)[:, -1, :], mx.stack(news)

    def feed(self, token: int) -> mx.array:
        """Logits after ``token`` at the next position; its keys and values written once computed."""
        bucket = -(-(self.length + 1) // BUCKET) * BUCKET
        windows = [buffer[:, :, :bucket] for buffer in self.buffers]
        valid = mx.arange(bucket) < self.length
        logits, news = self.step_fn(mx.array([token]), mx.array([self.length], mx.int32), valid, *windows)
        mx.eval(logits, news)
        del windows  # the step's reads are done: the writes below are in place
        for index in range(len(self.buffers)):
            self.buffers[index][:, :, self.length:self.length + 1] = news[index]
        self.length += 1
        return logits


def stack_reply(model, tokens: int) -> tuple[list[int], list[tuple[float, float]]]:
    stack = WholeStack(model, len(PROMPT) + tokens + BUCKET)
    for token in PROMPT[:-1]:  # the prompt a token at a time (a study of decode steps, not of prefill)
        stack.feed(token)
    out, marks, token = [], [], PROMPT[-1]
    for _ in range(tokens):
        token = int(mx.argmax(stack.feed(token)).item())
        out.append(token)
        marks.append((time.perf_counter(), time.thread_time()))
    return out, marks


def engine_reply(engine: Engine, tokens: int) -> tuple[list[int], list[tuple[float, float]]]:
    out, marks = [], []
    for event in engine.generate(PROMPT, engine.new_caches(), GenerationParams(max_tokens=tokens, temperature=0.0)):
        if isinstance(event, TokenEvent):
            out.append(event.token)
            marks.append((time.perf_counter(), time.thread_time()))
    return out, marks


def per_token(marks: list[tuple[float, float]]) -> tuple[float, float]:
    """(wall ms, building thread's CPU ms) per token, past the first 10 tokens."""
    (w0, c0), (w1, c1) = marks[10], marks[-1]
    n = len(marks) - 11
    return 1000 * (w1 - w0) / n, 1000 * (c1 - c0) / n


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "qwen3-0.6b"
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    if name == "mini":
        ref = str(ROOT / "assets" / "models" / "mini-target")
    else:
        from bench.twins import twin_folder
        ref = str(twin_folder(name, bits=None))
    loaded = load_model(ref)
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind="paged"))
    engine.eos_ids = set()
    engine_reply(engine, 16), stack_reply(loaded.model, 16)  # warm up: kernels, traces
    figures: dict[str, list[tuple[float, float]]] = {"engine": [], "stack": []}
    for _ in range(3):  # alternated
        ours, marks = engine_reply(engine, tokens)
        figures["engine"].append(per_token(marks))
        theirs, marks = stack_reply(loaded.model, tokens)
        figures["stack"].append(per_token(marks))
        if ours[:len(theirs)] != theirs[:len(ours)]:
            first = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
            print(f"tokens differ from position {first} (float rounding of another order of operations)")
    for way, values in figures.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        print(f"{way:7s} wall {wall:7.2f} ms/token   building thread {cpu:6.2f} ms/token   "
              f"(runs: {', '.join(f'{w:.1f}/{c:.1f}' for w, c in values)})")


if __name__ == "__main__":
    main()

"""Where a step's time goes, plain and drafted: each kind of pass of the batched forward, the rounds' verdicts
and the whole step, timed in the engine (no server) on ``draft_control.py``'s load.

A pass is keyed by (the model's layers, decode rows, prompt-feed chunks, the chunks' rows): on the embedded
pair (6 target layers, 1 draft layer) a plain step of 2 replies is ``(6, 2, 0, 0)``; a round of k = 4 is the
draft's first pass ``(1, 0, 2, n)``, its k - 1 decode passes ``(1, 2, 0, 0)`` and the verification
``(6, 0, 2, 10)``. Wall time of each call (the CPU starts each layer as its graph is built, so a pass's time
is mostly building it; ``verdicts`` waits for what is left). Medians over one load after two warm-ups.

Run from the project's root: ``.venv/bin/python bench/studies/round_parts.py [MODE] [REPLIES]`` (MODE as in
``draft_control.py``: plain, adaptive, k1 ... k8; defaults k4 and 2). Figures: docs/engine.md (2026-11-30,
tenth session).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import draft_control  # noqa: E402  (imports mlxcore first)
from mlxcore.batching.batch_forward import BatchDecoder  # noqa: E402
from mlxcore.batching.runner import BatchRunner  # noqa: E402
from mlxcore.batching.spec_rows import BatchRound  # noqa: E402

TIMES: defaultdict[tuple, list[float]] = defaultdict(list)


def timed(owner: type, name: str, key: Callable[..., tuple]) -> None:
    """Replace ``owner.name`` by a wrapper that adds each call's wall time under ``key(self, *args)``."""
    original = getattr(owner, name)

    def wrapper(self, *args, **kwargs):
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        TIMES[key(self, *args)].append(time.perf_counter() - start)
        return out

    setattr(owner, name, wrapper)


def pass_key(decoder: BatchDecoder, caches: list, inputs: object, feeds: tuple = (), *rest: object) -> tuple:
    return len(decoder.forward._layers), len(caches), len(feeds), sum(len(feed.ids) for feed in feeds)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "k4"
    replies = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    timed(BatchDecoder, "__call__", pass_key)
    timed(BatchRound, "verdicts", lambda *_: ("verdicts",))
    timed(BatchRunner, "step", lambda *_: ("step",))
    engine = draft_control.engine(mode)
    draft_control.load(engine, replies)
    draft_control.load(engine, replies)
    TIMES.clear()
    rate = draft_control.load(engine, replies)
    print(f"{mode}, {replies} replies: {rate:.0f} tok/s")
    for key, times in sorted(TIMES.items(), key=lambda item: -sum(item[1]))[:12]:
        print(f"  {str(key):18s} {len(times):4d} calls, median {1000 * statistics.median(times):6.2f} ms, "
              f"total {1000 * sum(times):5.0f} ms")


if __name__ == "__main__":
    main()

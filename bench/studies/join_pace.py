"""``join_stall_seconds``' scenario (a 2,000-token prompt joins 4 decoding streams) with the pace held at a fixed
number of token-layers a step instead of adapting (0: the pace as it ships), to see what the two goals cost each
other on this device: the join's first token, the streams' gaps while the prompt is read against the same
streams' gaps with nobody joining, and the reading's own seconds (``bench.batching._reading``).

Run from the project's root: ``.venv/bin/python bench/studies/join_pace.py [--model REF] [WORK ...]``
(default: the embedded target; 0, 16, 64, 256 and 1,024 token-layers a step).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

import mlxcore  # noqa: F401,E402  (optimized BLAS before mlx)

from bench.batch_load import JOIN_PROMPT_TOKENS, JOIN_RUNNING, batch_prompts, stream_prompt  # noqa: E402
from bench.batching import _engine, _reading, decode_streams, join_run  # noqa: E402
from bench.mlx_lm_batch import JOIN_AFTER, stall_figures  # noqa: E402
from mlxcore.batching import pacing  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mini-target")
    parser.add_argument("work", nargs="*", type=int, default=[0, 16, 64, 256, 1024])
    args = parser.parse_args()
    engine = _engine(args.model)
    vocab = engine.model.args.vocab_size
    adapt = pacing.Pacing.observe_feed
    for work in args.work:
        pacing.Pacing.observe_feed = adapt if not work else (lambda self, *_, w=work: setattr(self, "work", w))
        join_run(engine, joining=stream_prompt(vocab, 98, JOIN_PROMPT_TOKENS))  # warm-up, another prompt
        traces, joined_at = join_run(engine)
        ours = stall_figures(traces[:-1], traces[-1], joined_at)
        quiet = decode_streams(engine, batch_prompts(vocab, JOIN_RUNNING), JOIN_AFTER + max(ours["gaps_after_join"]))
        reading = _reading(traces[:-1], traces[-1].times[0], joined_at, quiet, ours["median_step_seconds"])
        print(f"work {work or 'paced'}: first token {ours['join_ttft_seconds']:.2f} s, reading "
              f"{reading['reading_seconds']:.2f} s, gaps while reading p99 {reading['reading_p99_vs_quiet']:.1f} x "
              f"the same steps unjoined, window p99 {ours['p99_ratio']:.1f} x the step before (after the first "
              f"token {ours['after_join_step_ratio']:.1f} x)", flush=True)
    pacing.Pacing.observe_feed = adapt


if __name__ == "__main__":
    main()

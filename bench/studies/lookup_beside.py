"""Prompt lookup beside a draft model (``drafters.LookupFirst``, the default) against the draft model alone.

- chat: the embedded pair on ``spec_speedup_greedy``'s chat questions (replies that repeat little): lookup
  must cost nothing there;
- edit: ``lookup_speedup_edit``'s task (a reply writing out again a 1,500-token text of its prompt, edited)
  on the text model (the 0.6B twin's geometry), drafted by a 2-layer model of the same geometry that writes
  the same text (its draft agrees with the target every time): what lookup saves is the draft's passes.

Greedy decode tok/s, paired runs. Run from the project's root:
``.venv/bin/python bench/studies/lookup_beside.py [RUNS]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlxcore  # noqa: E402,F401  (optimized BLAS before mlx)
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.models import qwen3  # noqa: E402

from bench.lookup import edited_prompt, text_model  # noqa: E402
from bench.prompts import chat_prompts  # noqa: E402
from bench.speculative import _ours, _rate_over_prompts  # noqa: E402
from bench.timing import paired_median  # noqa: E402
from mlxcore.engine import Engine, KVConfig  # noqa: E402
from mlxcore.loading import load_model  # noqa: E402
from mlxcore.params import GenerationParams  # noqa: E402


def paired(target, tokenizer, draft, prompts, tokens: int, runs: int, no_eos: bool) -> dict:
    kv = KVConfig(kind="paged")
    both = Engine(target, tokenizer, kv=kv, draft_model=draft, prompt_lookup=True)
    alone = Engine(target, tokenizer, kv=kv, draft_model=draft)
    for engine in (both, alone):
        if no_eos:
            engine.eos_ids = set()
    params = GenerationParams(max_tokens=tokens)
    ours, theirs = _ours(both, params), _ours(alone, params)
    _rate_over_prompts(ours, prompts[:1]), _rate_over_prompts(theirs, prompts[:1])  # warm up, learn k
    r = paired_median(lambda: _rate_over_prompts(ours, prompts), lambda: _rate_over_prompts(theirs, prompts), runs)
    return {"ratio": round(r["ratio"], 3), "with_lookup_tps": round(r["ours"]), "draft_alone_tps": round(r["theirs"]),
            "ratios": [round(x, 3) for x in r["ratios"]]}


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    pair = load_model("mini-target"), load_model("mini-draft")
    print("chat", paired(pair[0].model, pair[0].tokenizer, pair[1].model, chat_prompts(pair[0].tokenizer), 200, runs,
                         False), flush=True)
    model, text = text_model()
    draft = qwen3.Model(qwen3.ModelArgs.from_dict({**vars(model.args), "num_hidden_layers": 2}))
    draft.load_weights([(name, value) for name, value in tree_flatten(model.parameters())
                        if not name.startswith("model.layers.") or int(name.split(".")[2]) < 2])
    prompts = [edited_prompt(text, 1500, seed) for seed in range(2)]
    print("edit", paired(model, None, draft, prompts, 256, runs, True), flush=True)


if __name__ == "__main__":
    main()

"""Rows `sampled_decode_vs_mlx_lm` and `greedy_decode_vs_mlx_lm_twin`: plain decode on the 0.6B twin;
`hybrid_decode_vs_mlx_lm`: the same, greedy, on the Qwen3.5-9B twin (hybrid layers, standard cache).

The twin has Qwen3's 151,936-token vocabulary, where sampling costs as much as
a few layers of the model; float32 weights keep a CPU run short.
"""

from __future__ import annotations

import copy

from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler

from bench.decode import PROMPT
from bench.timing import paired_median, stream_rate
from mlxcore.chat_template import render_chat
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from mlxcore.loading import load_model
from mlxcore.params import GenerationParams
from bench.twins import twin_folder

TWIN = "qwen3-0.6b"
QWEN3_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}  # Qwen3's generation_config.json
GREEDY = {"temperature": 0.0}


def twin_decode_vs_mlx_lm(runs: int, sampling: dict, tokens: int = 256, kv: str = "paged", twin: str = TWIN) -> dict:
    """Ours / ``mlx_lm.stream_generate`` on the float32 twin, exactly ``tokens`` tokens each (EOS ignored).

    ``sampling`` holds temperature and optionally top_p and top_k; mlx-lm gets
    them through ``make_sampler``.
    """
    loaded = load_model(str(twin_folder(twin, bits=None)))
    ids = render_chat(loaded.tokenizer, [{"role": "user", "content": PROMPT}], enable_thinking=False)
    engine = Engine(loaded.model, loaded.tokenizer, kv=KVConfig(kind=kv))
    engine.warm_up()  # as `mlxchat` does when it opens a model
    engine.eos_ids = set()  # both sides run to exactly `tokens` tokens
    their_tokenizer = copy.copy(loaded.tokenizer)
    their_tokenizer.eos_token_ids = set()
    params = GenerationParams(max_tokens=tokens, seed=0, **sampling)
    sampler = make_sampler(temp=sampling["temperature"], top_p=sampling.get("top_p", 0.0),
                           top_k=sampling.get("top_k", 0))

    def ours() -> float:
        events = engine.generate(ids, engine.new_caches(), params)
        return stream_rate(events, lambda e: isinstance(e, TokenEvent))[0]

    def theirs() -> float:
        return stream_rate(stream_generate(loaded.model, their_tokenizer, ids, max_tokens=tokens, sampler=sampler))[0]

    ours(), theirs()  # warm up both paths
    result = paired_median(ours, theirs, runs)
    return {"value": result["ratio"], "ours_tps": result["ours"], "mlx_lm_tps": result["theirs"],
            "ratios": result["ratios"], "kv": kv, "tokens": tokens, "model": f"{twin} twin, float32",
            "sampling": sampling}

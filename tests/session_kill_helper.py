"""Engines for the session tests, and the scripts they run in other processes.

``python tests/session_kill_helper.py save-loop FILE TOKENS`` builds a session
whose cache holds TOKENS random tokens, then saves it to FILE again and again,
printing one line per finished save, until it is killed (the SIGKILL test).

``python tests/session_kill_helper.py turn FILE ENGINE TEXT`` loads FILE on a
fresh engine ("tiny-<kind>" or "embedded-<kind>"), sends TEXT and prints the
reply and the turn's figures as JSON (the new-process restore test).
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import mlxcore  # noqa: E402,F401  (optimized BLAS before mlx)
import mlx.core as mx  # noqa: E402

from assets import MODELS_DIR  # noqa: E402
from bench.draft_lengths import FixedDraftLength  # noqa: E402
from mlxcore.engine import Engine, KVConfig  # noqa: E402
from mlxcore.kv.base import ModelCache  # noqa: E402
from sessions.chat_session import ChatSession  # noqa: E402
from sessions.messages import Message  # noqa: E402
from tiny_models import tiny_qwen3  # noqa: E402

TOKENIZER_FOLDER = MODELS_DIR / "mini-target"  # the embedded chat tokenizer (it ships with the models)
VOCAB = 2048
WINDOW = {"rotating": 256}  # tokens; more than the test conversations hold
KILL_MODEL = dict(layers=4, hidden=64, heads=4, kv_heads=4, head_dim=64)  # 8 KiB of cache per token


@cache
def chat_tokenizer():
    """The embedded chat tokenizer (mlx-lm's wrapper)."""
    from mlx_lm.tokenizer_utils import load
    return load(TOKENIZER_FOLDER)


@cache
def tiny_model(seed: int, dtype: str = "float32"):
    model = tiny_qwen3(seed, vocab_size=VOCAB)
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    return model


def tiny_engine(kind: str = "paged", *, draft: bool = True, seed: int = 0, draft_seed: int = 1,
                max_kv: int | None = None, dtype: str = "float32") -> Engine:
    """A chat engine on tiny random models with the embedded tokenizer; fingerprints name the seeds."""
    engine = Engine(tiny_model(seed, dtype), chat_tokenizer(), kv=KVConfig(kind=kind, max_kv=max_kv),
                  draft_model=tiny_model(draft_seed, dtype) if draft else None,
                  fingerprint=f"tiny-{seed}-{dtype}", draft_fingerprint=f"tiny-{draft_seed}-{dtype}" if draft else "")
    engine.draft_control = FixedDraftLength(4)  # the same rounds in every run and process
    return engine


def kill_engine() -> Engine:
    """A tokenizer-free engine whose caches are large for their cost: what the SIGKILL test saves."""
    return Engine(tiny_qwen3(0, **KILL_MODEL), kv=KVConfig(kind="standard"), fingerprint="kill")


def big_session(engine: Engine, tokens: int) -> ChatSession:
    """A session whose cache holds ``tokens`` random keys and values (no forward pass needed)."""
    session = ChatSession(engine, "system prompt")
    session.messages += [Message("user", "hello " * 50), Message("assistant", "hi " * 50)]
    g = session.caches.target.geometry
    shape = (1, g.kv_heads, tokens, g.head_dim)
    tensors = {f"{i}.{n}": mx.random.normal(shape) for i in range(g.num_layers) for n in ("keys", "values")}
    meta = {"kind": "standard", "tokens": [t % VOCAB for t in range(tokens)]}
    session.caches.target = ModelCache.from_state(engine.model, tensors, meta)
    session.caches.ids = list(meta["tokens"])
    return session


def embedded_engine(kind: str = "paged") -> Engine:
    """The embedded pair (assets/models/mini-target and mini-draft) with a fixed draft length."""
    from mlxcore.launch import ModelChoice, open_engine
    kv = KVConfig(kind=kind, max_kv=WINDOW.get(kind))
    engine = open_engine(ModelChoice(model="mini-target", draft="mini-draft"), kv).engine
    engine.draft_control = FixedDraftLength(4)  # the same rounds in every run and process
    return engine


def engine_named(name: str) -> Engine:
    """"tiny-<kind>" or "embedded-<kind>": the same engine in every process (rotating: a 256-token window)."""
    family, kind = name.split("-")
    return tiny_engine(kind, max_kv=WINDOW.get(kind)) if family == "tiny" else embedded_engine(kind)


def save_loop(path: str, tokens: str) -> None:
    session = big_session(kill_engine(), int(tokens))
    count = 0
    while True:
        session.save(path)
        count += 1
        print(f"saved {count}", flush=True)


def turn(path: str, engine: str, text: str) -> None:
    import json
    session = ChatSession.load(path, engine_named(engine))
    before = {"target": session.caches.tokens,
              "draft": session.caches.ids[:session.caches.draft.offset] if session.caches.draft else None}
    reply = session.send(text)
    stats = session.last_stats
    print(json.dumps({"reply": reply, "reused": stats.reused_tokens, "prefill": stats.prefill_tokens,
                      "prompt": stats.prompt_tokens, "before": before, "note": session.restore_note}))


if __name__ == "__main__":
    {"save-loop": save_loop, "turn": turn}[sys.argv[1]](*sys.argv[2:])

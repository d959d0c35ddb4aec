"""The check every "nothing was lost" test ends with: the next turn on a reused cache equals a cold run.

"Cold" is a new standard-cache engine on the same model (for a quantized cache, a
new paged one with the same bits), fed the same prompt ids with nothing cached;
greedy, so a speculative warm turn must match it token for token (exact on the CPU backend, where a block of
rows rounds as each row alone; docs/internals.md, "What is exact on which device"). The prompt ids
must also spell the conversation exactly as the chat template renders it (they
may keep the model's own tokens for its earlier replies: mlxcore/held_tokens.py).
"""

from __future__ import annotations

import mlx.core as mx
from mlxcore.chat_template import render_chat_text
from mlxcore.engine import Engine, KVConfig
from mlxcore.events import TokenEvent
from sessions.chat_session import ChatSession


def send_matching_a_cold_run(session: ChatSession, text: str) -> str:
    """Send ``text`` (greedy params expected); assert the turn equals a cold run; return the reply."""
    assert session.params.greedy, "a cold run matches token for token only when decoding is greedy"
    engine = session.engine
    before = [m.as_dict() for m in session.messages] + [{"role": "user", "content": text}]
    reply = session.send(text)
    stats, held = session.last_stats, session.caches.tokens
    prompt, generated = held[:stats.prompt_tokens], held[stats.prompt_tokens:]
    assert engine.tokenizer.decode(prompt) == render_chat_text(engine.tokenizer, before,
                                                               enable_thinking=session.enable_thinking)
    bits = engine.kv.kv_bits  # the standard cache is float only
    kv = KVConfig(kind="paged", kv_bits=bits) if bits else KVConfig(kind="standard")
    cold = Engine(engine.model, engine.tokenizer, kv=kv)
    cold.eos_ids = engine.eos_ids
    cold.context_length = engine.context_length  # a reply is capped by the room the context leaves
    tokens = [e.token for e in cold.generate(prompt, cold.new_caches(), session.params) if isinstance(e, TokenEvent)]
    assert generated == tokens, "the reused cache answered differently from a cold run on the same prompt"
    return reply


def same_state(a, b, role: str = "target") -> bool:
    """Whether two conversations' ``role`` caches save the same tensors and metadata (``state_dict``), bit for
    bit."""
    (ta, ma), (tb, mb) = getattr(a, role).state_dict(a.ids), getattr(b, role).state_dict(b.ids)
    return ma == mb and ta.keys() == tb.keys() and all(mx.array_equal(ta[k], tb[k]).item() for k in ta)


def same_chat(a: ChatSession, b: ChatSession) -> bool:
    """Same history, and target and draft caches that save the same."""
    return a.history == b.history and all(same_state(a.caches, b.caches, r)
                                          for r in ("target", "draft"))

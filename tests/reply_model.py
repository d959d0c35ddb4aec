"""A Qwen3 that always answers the same short reply and stops: for agents whose prompts run to 14k tokens.

The embedded pair's context is too small for an agent's prompt and a random-weight
twin never stops. This model's next token depends on the current token only: its
layers add nothing to the residual stream (attention and MLP outputs are zero), so
the last hidden state is the current token's embedding, and ``lm_head`` maps it to
the next token of ``REPLY``, then to ``<|im_end|>``. Any token outside the reply
leads to the reply's first token, so whatever the prompt (thinking on or off), the
model says ``REPLY`` and stops, at any temperature an agent sends (a margin of 64 in
the logits). It loads through mlx-lm and our engine like any Qwen3 folder: a twin's
config, weights and Qwen3's real tokenizer, 40,960 positions (Qwen3's own).
"""

from __future__ import annotations

from pathlib import Path

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen3
from tokenizers import Tokenizer

from assets import QWEN3_TOKENIZER_DIR
from bench.twin_build import save_folder
from bench.twin_specs import EOS_ID, TwinSpec, twin_config

REPLY = "Hello from mlxchat."
# One small layer: a 14k-token prompt reads in seconds on a CPU; the context is Qwen3's 40,960.
SPEC = TwinSpec(mirrors="(none: a fixed reply)", num_layers=1, kv_heads=1, head_dim=64, num_heads=1,
                hidden_size=64, intermediate_size=64, tie_embeddings=False)
LOGIT = 8.0  # lm_head's weight on a token's own axis: after RMSNorm that axis reads sqrt(64) = 8, logit 64


def reply_ids() -> list[int]:
    """``REPLY``'s token ids (distinct: each one names the next)."""
    tokenizer = Tokenizer.from_file(str(QWEN3_TOKENIZER_DIR / "tokenizer.json"))
    ids = tokenizer.encode(REPLY, add_special_tokens=False).ids
    assert len(set(ids)) == len(ids) < SPEC.hidden_size, ids
    return ids


def write_reply_model(folder: Path) -> Path:
    """Write the model into ``folder`` (created); returns it."""
    config = twin_config(SPEC, bits=None)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    # Every layer weight zero (so each adds nothing), every norm one.
    model.update(tree_unflatten([(name, mx.ones(value.shape) if value.ndim == 1 else mx.zeros(value.shape))
                                 for name, value in tree_flatten(model.parameters())]))
    ids = reply_ids()
    vocab, hidden = SPEC.vocab_size, SPEC.hidden_size
    # Axis 0 is "not in the reply"; reply token i has axis i + 1.
    embed = mx.zeros((vocab, hidden)).at[:, 0].add(1.0)
    embed[mx.array(ids)] = mx.eye(hidden)[1:len(ids) + 1]
    # The token after axis j: the reply's first token after axis 0, then the next, then <|im_end|>.
    head = mx.zeros((vocab, hidden))
    head[mx.array([*ids, EOS_ID])] = LOGIT * mx.eye(hidden)[:len(ids) + 1]
    model.model.embed_tokens.weight = embed
    model.lm_head.weight = head
    save_folder(folder, model, config)
    return folder

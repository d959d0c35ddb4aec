"""The load of the continuous-batching rows: the same prompts for our scheduler and for mlx-lm's.

Prompts are token ids made by a formula, not text, so that both sides see the
very same ids on any model without a tokenizer, and every stream has its own
length (the batch then needs padding or per-stream positions, as real chats do).
"""

from __future__ import annotations

STREAMS = 8  # streams decoding at once in the throughput row
REPLY_TOKENS = 256  # tokens every stream generates (end-of-sequence made impossible)
JOIN_RUNNING = 4  # streams already decoding when the long prompt joins
JOIN_PROMPT_TOKENS = 2000  # length of the prompt that joins them
# The running streams' length in the join rows: they must decode until the joined prompt's watch ends (they are
# stopped then); streams that ended during the join let the rest of the prompt be read with nothing decoding.
JOIN_RUNNING_TOKENS = 1 << 14
_JOIN_STREAM = 99  # the stream number the joining prompt is made with, apart from the batch's


def stream_prompt(vocab_size: int, stream: int, tokens: int) -> list[int]:
    """Prompt ids of ``stream``: token i is ``(i * 7919 + stream * 131) % (vocab_size - 1) + 1``.

    The ids run over 1 .. vocab_size - 1 (never 0, often the pad id); 7919 is a
    prime, so consecutive tokens are spread over the vocabulary.
    """
    if vocab_size < 2:
        raise ValueError(f"A vocabulary of {vocab_size} ids cannot make a prompt; it needs at least 2.")
    return [(i * 7919 + stream * 131) % (vocab_size - 1) + 1 for i in range(tokens)]


def batch_prompts(vocab_size: int, streams: int = STREAMS) -> list[list[int]]:
    """``streams`` prompts, stream s of length 32 + 16 * s (32, 48, ... tokens)."""
    return [stream_prompt(vocab_size, s, 32 + 16 * s) for s in range(streams)]


def long_prompt(vocab_size: int, tokens: int = JOIN_PROMPT_TOKENS) -> list[int]:
    """The prompt that joins the running streams in the join-stall row (stream number 99)."""
    return stream_prompt(vocab_size, _JOIN_STREAM, tokens)

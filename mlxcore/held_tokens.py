"""Prompt ids that keep a cache's own tokens: for replies the model wrote in tokens the tokenizer would not pick.

Each turn re-renders the whole conversation as text and tokenizes it; the engine
then reuses the cache up to the first id that differs. A model does not always
write its reply in the tokenizer's own segmentation (a random-weight twin almost
never does; a real model sometimes does, in numbers, code or rare words): its
reply, tokenized again, then differs from the ids in the cache at the first such
spot, and everything after it is computed again although the text is the same.
When the text the cache holds is where the new prompt starts, the prompt takes
the cache's ids for it and tokenizes only the rest, so nothing is recomputed.
When the cache holds the tokenizer's own ids (the usual case), nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mlxcore.sequences import common_prefix_length

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def prompt_ids(tokenizer: TokenizerWrapper, text: str, held: Sequence[int]) -> list[int]:
    """The ids of ``text`` as a prompt for caches that hold ``held`` (see the module docstring)."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not held or common_prefix_length(held, ids) == len(held):
        return ids
    spelled = tokenizer.decode(list(held))
    if not spelled or not text.startswith(spelled):
        return ids  # the conversation changed before the end of what the cache holds (an edit, dropped reasoning)
    return list(held) + list(tokenizer.encode(text[len(spelled):], add_special_tokens=False))

"""Prompt ids that keep the cache's own tokens when the model spelled its text differently (Qwen3's tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from assets import QWEN3_TOKENIZER_DIR
from mlxcore.held_tokens import prompt_ids

TEXT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello world<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(Path(QWEN3_TOKENIZER_DIR))


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def model_spelled(tokenizer) -> list[int]:
    """The first turn as the cache holds it, the reply written "Hel" + "lo" + " world" (not the tokenizer's way)."""
    head = encode(tokenizer, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    reply = [tokenizer.convert_tokens_to_ids(t) for t in ("Hel", "lo", "Ġworld")] + [tokenizer.eos_token_id]
    return head + reply


def test_the_model_spelling_is_kept_and_only_the_rest_tokenized(tokenizer):
    held = model_spelled(tokenizer)
    canonical = encode(tokenizer, TEXT)
    assert canonical[:len(held)] != held, "the reply is spelled differently from the tokenizer's own ids"
    ids = prompt_ids(tokenizer, TEXT, held)
    assert ids[:len(held)] == held
    assert tokenizer.decode(ids) == TEXT


def test_the_tokenizers_ids_when_the_cache_holds_them_or_the_text_changed(tokenizer):
    canonical = encode(tokenizer, TEXT)
    assert prompt_ids(tokenizer, TEXT, canonical[:20]) == canonical
    assert prompt_ids(tokenizer, TEXT, []) == canonical
    edited = TEXT.replace("Hello world", "Goodbye")
    assert prompt_ids(tokenizer, edited, model_spelled(tokenizer)) == encode(tokenizer, edited)

"""Byte-level BPE tokenizer trained on the corpus, with Qwen3's special tokens by name."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from recipe.template import CHAT_TEMPLATE

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # control tokens, hidden when decoding
THINK = ["<think>", "</think>"]                           # atomic, but kept in decoded text like Qwen3's
TOOL = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]  # the same, as in Qwen3
ADDED = THINK + TOOL
EOS, PAD = "<|im_end|>", "<|endoftext|>"
# Letters group into words (with one leading space); every digit stands alone so numbers
# are read and written digit by digit; runs of newlines stay one piece wherever they occur.
SPLIT = r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s*[\r\n]+|\s+(?!\S)|\s+"


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Train on ``texts``; the result holds exactly ``vocab_size`` tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(ADDED), special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok


def tokenizer_config(tok: Tokenizer) -> dict:
    """The tokenizer_config.json that makes transformers (and so mlx-lm) use our template and eos."""
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": t in SPECIAL}
             for t in SPECIAL + ADDED}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def save_tokenizer(tok: Tokenizer, folder: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json (the only tokenizer files the models ship)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), indent=2) + "\n")

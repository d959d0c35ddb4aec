"""Rendering chats with Qwen3's own template (its real tokenizer files): what a later turn can reuse.

The reference for "what the cache holds" is what the engine fed the model: the
previous turn's prompt ids followed by the reply's ids. A later turn's prompt must
start with all of it when thinking is off, and with all of it up to the answer when
thinking was on (Qwen3's template drops earlier reasoning: that part is inherent).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from assets import MODELS_DIR, QWEN3_TOKENIZER_DIR
from mlxcore.chat_template import render_chat
from mlxcore.sequences import common_prefix_length
from mlxcore.think_blocks import EMPTY, close_open_block, keep_empty_blocks

ANSWER = "Paris is the capital of France.\n\nIt lies on the Seine."
REASONED = "<think>\nThe user asks about France.\n</think>\n\n" + ANSWER


@pytest.fixture(scope="module", params=["qwen3", "embedded"])
def tokenizer(request):
    return load_tokenizer(Path(QWEN3_TOKENIZER_DIR if request.param == "qwen3" else MODELS_DIR / "mini-target"))


def turn(tokenizer, history: list[dict], reply: str, *, thinking: bool) -> tuple[list[int], list[int]]:
    """(ids the cache holds after the reply, the next turn's prompt ids), with the reply stored as a session does."""
    prompt = render_chat(tokenizer, history, enable_thinking=thinking)
    generated = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    lead = EMPTY if not thinking else ""
    after = history + [{"role": "assistant", "content": lead + reply}, {"role": "user", "content": "And Italy?"}]
    return prompt + generated, render_chat(tokenizer, after, enable_thinking=thinking)


def test_plain_chats_render_exactly_as_the_template_does(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": REASONED}, {"role": "user", "content": "More?"}]
    for thinking in (True, False):
        assert render_chat(tokenizer, messages, enable_thinking=thinking) == list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=thinking))


def test_with_thinking_off_the_next_turn_reuses_the_whole_reply(tokenizer):
    history = [{"role": "user", "content": "What is the capital of France?"}]
    cached, following = turn(tokenizer, history, ANSWER, thinking=False)
    assert following[:len(cached)] == cached


def test_without_the_kept_block_the_reply_would_be_computed_again(tokenizer):
    """The reference behaviour this fixes: the template alone renders the history reply without its block."""
    history = [{"role": "user", "content": "What is the capital of France?"}]
    cached, _ = turn(tokenizer, history, ANSWER, thinking=False)
    plain = list(tokenizer.apply_chat_template(
        history + [{"role": "assistant", "content": EMPTY + ANSWER}, {"role": "user", "content": "And Italy?"}],
        add_generation_prompt=True, enable_thinking=False))
    prompt = render_chat(tokenizer, history, enable_thinking=False)
    assert common_prefix_length(cached, plain) < len(prompt), "the template alone breaks at the reply's block"


def test_with_thinking_on_only_the_answer_is_computed_again(tokenizer):
    history = [{"role": "user", "content": "What is the capital of France?"}]
    cached, following = turn(tokenizer, history, REASONED, thinking=True)
    prompt = render_chat(tokenizer, history, enable_thinking=True)
    assert common_prefix_length(cached, following) == len(prompt), "the reasoning is dropped, nothing before it"
    answer = tokenizer.encode(ANSWER, add_special_tokens=False)
    assert following[len(prompt):len(prompt) + len(answer)] == answer


def test_with_thinking_on_history_renders_exactly_as_the_template_does(tokenizer):
    """An empty block the model wrote itself is dropped from history, as Qwen3 was trained (see think_blocks)."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": EMPTY + ANSWER},
                {"role": "user", "content": "More?"}]
    assert render_chat(tokenizer, messages, enable_thinking=True) == list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=True))


def test_a_reply_cut_while_thinking_renders_closed(tokenizer):
    cut = "<think>\nLet me count the letters: s, t"
    stored, was_cut = close_open_block(cut)
    assert was_cut and stored == "<think>\nLet me count the letters: s, t\n</think>\n\n"
    assert close_open_block(REASONED) == (REASONED, False) and close_open_block(EMPTY + ANSWER)[1] is False
    messages = [{"role": "user", "content": "Spell it."}, {"role": "assistant", "content": stored},
                {"role": "user", "content": "Go on."}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=True, tokenize=False)
    assert "Let me count" not in text, "the unfinished reasoning is dropped from history, not shown as the answer"
    assert "<|im_start|>assistant\n<|im_end|>" in text


def test_only_replies_stored_with_the_block_get_it_back():
    text = "<|im_start|>user\nA<|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n<|im_start|>user\nC<|im_end|>\n"
    messages = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"},
                {"role": "user", "content": "C"}]
    assert keep_empty_blocks(text, messages) == text
    messages[1]["content"] = EMPTY + "B"
    assert keep_empty_blocks(text, messages) == text.replace("assistant\nB", "assistant\n" + EMPTY + "B")

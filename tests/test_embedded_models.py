"""The embedded demonstration models: they load offline, the template behaves like Qwen3's, they answer."""

from __future__ import annotations

import json
import os

import pytest

from assets import MODELS_DIR

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

NAMES = ("mini-target", "mini-draft", "mini-target-4bit")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
MAX_TOTAL_BYTES = 40 * 1000 * 1000


@pytest.fixture(scope="module", autouse=True)
def offline():
    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield
    if saved is None:
        del os.environ["HF_HUB_OFFLINE"]
    else:
        os.environ["HF_HUB_OFFLINE"] = saved


@pytest.fixture(scope="module")
def loaded() -> dict:
    return {name: load(str(MODELS_DIR / name)) for name in NAMES}


def greedy(model, prompt: list[int], eos: int, max_tokens: int = 120) -> list[int]:
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)
    out: list[int] = []
    while len(out) < max_tokens and (not out or out[-1] != eos):
        out.append(int(mx.argmax(logits[0, -1]).item()))
        logits = model(mx.array([out[-1:]]), cache=cache)
    return out


def chat(model, tokenizer, messages: list[dict], thinking: bool) -> str:
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=thinking)
    return tokenizer.decode(greedy(model, prompt, tokenizer.eos_token_id), skip_special_tokens=False)


def visible(reply: str) -> str:
    return reply.split("</think>")[-1].removesuffix("<|im_end|>").strip("\n")


@pytest.mark.parametrize("name", NAMES)
def test_model_loads_offline_and_replies_with_a_closed_turn(loaded, name):
    config = json.loads((MODELS_DIR / name / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    model, tokenizer = loaded[name]
    assert tokenizer.eos_token == "<|im_end|>" and config["eos_token_id"] == tokenizer.eos_token_id
    reply = chat(model, tokenizer, [{"role": "user", "content": "Hello!"}], thinking=False)
    assert reply.endswith("<|im_end|>"), reply
    assert reply.count("<|im_end|>") == 1 and "<|im_start|>" not in reply, reply


def test_all_models_ship_identical_tokenizer_files():
    for file in TOKENIZER_FILES:
        contents = {(MODELS_DIR / name / file).read_bytes() for name in NAMES}
        assert len(contents) == 1, f"{file} differs between the embedded models"


def test_quantized_target_is_4_bit():
    config = json.loads((MODELS_DIR / "mini-target-4bit" / "config.json").read_text())
    assert config["quantization"]["bits"] == 4


def test_embedded_models_fit_the_size_budget():
    total = sum(p.stat().st_size for p in MODELS_DIR.rglob("*") if p.is_file())
    assert total <= MAX_TOTAL_BYTES, f"assets/models holds {total / 1e6:.1f} MB"


def test_special_tokens_encode_atomically(loaded):
    tokenizer = loaded["mini-target"][1]
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.decode(ids) == token, (token, ids)


CONVERSATION = [
    {"role": "system", "content": "You are Kalo."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "<think>\nFIRST-REASONING\n</think>\n\n2 + 3 = 5."},
    {"role": "user", "content": "And 4 + 4?"},
]


def render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_template_opens_a_thinking_turn_or_prefills_an_empty_think(loaded):
    tokenizer = loaded["mini-target"][1]
    on = render(tokenizer, CONVERSATION, add_generation_prompt=True, enable_thinking=True)
    off = render(tokenizer, CONVERSATION, add_generation_prompt=True, enable_thinking=False)
    assert on.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"
    assert on.startswith("<|im_start|>system\nYou are Kalo.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n")
    assert render(tokenizer, CONVERSATION) + "<|im_start|>assistant\n" == on


def test_template_drops_reasoning_of_earlier_turns_only(loaded):
    tokenizer = loaded["mini-target"][1]
    history = render(tokenizer, CONVERSATION, add_generation_prompt=True)
    assert "FIRST-REASONING" not in history and "<think>" not in history
    assert "<|im_start|>assistant\n2 + 3 = 5.<|im_end|>\n" in history
    last = CONVERSATION + [{"role": "assistant", "content": "4 + 4 = 8.", "reasoning_content": "LAST"}]
    assert render(tokenizer, last).endswith("<|im_start|>assistant\n<think>\nLAST\n</think>\n\n4 + 4 = 8.<|im_end|>\n")


FIXED = [  # (messages, thinking, expected visible reply); answers worked out by hand
    ([{"role": "user", "content": "What is 23 + 45?"}], False,
     "Ones: 3 + 5 = 8, carry 0. Tens: 2 + 4 + 0 = 6.\n23 + 45 = 68."),
    ([{"role": "user", "content": "What is 47 × 6?"}], True, "47 × 6 = 282."),
    ([{"role": "user", "content": "what is 81 - 37"}], False,
     "Ones: 11 - 7 = 4, borrow 1. Tens: 8 - 3 - 1 = 4.\n81 - 37 = 44."),
    ([{"role": "user", "content": "What is the capital of France?"}], False, "The capital of France is Paris."),
    ([{"role": "user", "content": "Reverse the word apple."}], True, "The reverse of apple is elppa."),
    ([{"role": "user", "content": "Convert 7 kilometers to meters."}], False,
     "7 × 1000 = 7000.\n7 kilometers is 7000 meters."),
    ([{"role": "user", "content": "Sort these numbers from smallest to largest: 7, 2, 5."}], False,
     "In ascending order: 2, 5, 7."),
    # (recall of a made-up name is the pair's weakest skill, 62% held out: the model card)
    ([{"role": "user", "content": "My name is Mara."}, {"role": "assistant", "content": "Nice to meet you, Mara!"},
      {"role": "user", "content": "What is my name?"}], False, "Your name is Mara."),
    ([{"role": "user", "content": "Please remember the number 427."},
      {"role": "assistant", "content": "Okay, I will remember 427."},
      {"role": "user", "content": "What is 12 + 30?"},
      {"role": "assistant", "content": "<think>\nsteps\n</think>\n\n12 + 30 = 42."},
      {"role": "user", "content": "What number did I ask you to remember?"}], True, "You asked me to remember 427."),
]


@pytest.mark.parametrize("messages, thinking, expected", FIXED)
def test_target_answers_fixed_questions(loaded, messages, thinking, expected):
    model, tokenizer = loaded["mini-target"]
    reply = chat(model, tokenizer, messages, thinking)
    assert visible(reply) == expected, reply
    if thinking:
        assert reply.startswith("<think>\n") and "</think>" in reply, reply
    else:
        assert "<think>" not in reply, reply


def test_draft_mostly_agrees_with_the_target(loaded):
    """Greedy acceptance: the draft's next-token guesses along the target's own reply."""
    (target, tokenizer), draft = loaded["mini-target"], loaded["mini-draft"][0]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 58 + 27?"}],
                                           add_generation_prompt=True, enable_thinking=True)
    reply = greedy(target, prompt, tokenizer.eos_token_id)
    guesses = mx.argmax(draft(mx.array([prompt + reply]))[0], axis=-1).tolist()[len(prompt) - 1: -1]
    agreement = sum(g == t for g, t in zip(guesses, reply)) / len(reply)
    assert agreement >= 0.7, f"draft agreed on {agreement:.0%} of {len(reply)} tokens"

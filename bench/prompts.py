"""Chat prompts the benchmarks share: tasks the embedded models were trained on, answered at length."""

from __future__ import annotations

from mlxcore.chat_template import render_chat

QUESTIONS = (
    "What is 347 + 589?",
    "Reverse the word lantern.",
    "How many meters are in 7 kilometers?",
    "Sort these numbers: 42, 7, 19, 88, 3.",
    "What is 63 - 28?",
    "Write the word orchard in upper case.",
    "How many letters r are in the word strawberry?",
    "What is 12 times 9?",
)


def chat_prompts(tokenizer, thinking: bool = True) -> list[list[int]]:
    """Token ids of each question as a one-turn chat."""
    return [render_chat(tokenizer, [{"role": "user", "content": q}], enable_thinking=thinking) for q in QUESTIONS]

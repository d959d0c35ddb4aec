"""Qwen3's think blocks in a rendered chat: a reply written with thinking off keeps its empty block.

With thinking off, Qwen3's template renders a reply in history without the empty block it was generated
after, so the KV cache would stop matching where it began; mlxchat stores such replies with their block
(``EMPTY`` + answer) and renders them with it. With thinking on, history renders as Qwen3 was trained.
Why, and the answers measured both ways: docs/decisions.md, "Keeping the empty think block in history".
"""

from __future__ import annotations

from collections.abc import Sequence

EMPTY = "<think>\n\n</think>\n\n"
OPEN, CLOSE = "<think>", "</think>"
HEADER = "<|im_start|>assistant\n"
NEWLINE = "\n"


def thought_reply(reasoning: str, answer: str) -> str:
    """A reply as Qwen3 writes it with thinking on (and its template renders the last one): the block, then
    the answer; for empty reasoning that is ``EMPTY`` + answer, as written with thinking off."""
    return f"{OPEN}\n{reasoning.strip(NEWLINE)}\n{CLOSE}\n\n{answer.lstrip(NEWLINE)}"


def keep_empty_blocks(text: str, messages: Sequence[dict]) -> str:
    """``text`` (a rendered chat) with the empty block put back before each reply stored with one."""
    cursor = 0
    for message in messages:
        content = message["content"]
        if message["role"] != "assistant" or not content.startswith(EMPTY):
            continue
        answer = content[len(EMPTY):].lstrip("\n")
        at = text.find(HEADER, cursor)
        while at >= 0:
            body = at + len(HEADER)
            if text.startswith(EMPTY + answer, body):  # rendered with its block (the template's last reply)
                cursor = body + len(EMPTY) + len(answer)
                break
            if text.startswith(answer, body):
                text = text[:body] + EMPTY + text[body:]
                cursor = body + len(EMPTY) + len(answer)
                break
            at = text.find(HEADER, body)
    return text


def close_open_block(reply: str) -> tuple[str, bool]:
    """A reply cut inside ``<think>`` closed, so the next turn's template is well formed; and whether it was."""
    if OPEN in reply and CLOSE not in reply.split(OPEN, 1)[1]:
        return reply.rstrip("\n") + "\n" + CLOSE + "\n\n", True
    return reply, False

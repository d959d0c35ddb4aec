"""ReplyText: deltas never show the start of a stop string that then comes, and join up to the whole reply."""

from __future__ import annotations

import pytest

from mlxcore.reply_text import ReplyText

PIECES = {1: "The answer", 2: " is 4", 3: "</an", 4: "swer>", 5: " more", 6: "</", 7: "a", 8: "nd"}
EOS = 0


class Detokenizer:
    def __init__(self) -> None:
        self.last_segment = ""

    def add_token(self, token: int) -> None:
        self.last_segment = PIECES[token]

    def finalize(self) -> None:
        self.last_segment = ""


class Tokenizer:
    @property
    def detokenizer(self) -> Detokenizer:
        return Detokenizer()


def run(tokens: list[int], stop=("</answer>",), max_tokens=None) -> tuple[list[str], str | None, str]:
    reply = ReplyText(Tokenizer(), {EOS}, stop, max_tokens)
    deltas, finish = [], None
    for token in tokens:
        delta, finish = reply.add(token)
        deltas.append(delta)
        if finish:
            break
    return deltas, finish, reply.text


def test_a_stop_string_split_over_tokens_is_never_shown():
    deltas, finish, text = run([1, 2, 3, 4, 5])
    assert finish == "stop" and text == "The answer is 4"
    assert "".join(deltas) == text and not any("<" in d for d in deltas)


def test_held_text_comes_out_once_it_cannot_start_the_stop_string():
    deltas, finish, text = run([1, 6, 7, 8, 5, EOS])
    assert deltas[1] == "" and deltas[2] == "", "'</' then '</a' could begin '</answer>'"
    assert deltas[3] == "</and", "'</and' cannot"
    assert finish == "eos" and "".join(deltas) == text == "The answer</and more"


@pytest.mark.parametrize("end", [EOS, None])
def test_held_text_comes_out_at_the_end(end):
    tokens = [1, 3] + ([end] if end is not None else [])
    deltas, finish, text = run(tokens, max_tokens=None if end is not None else 2)
    assert finish == ("eos" if end is not None else "length")
    assert "".join(deltas) == text == "The answer</an"

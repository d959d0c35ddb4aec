"""The recipe's tool conversations: its template writes tools, calls and results as Qwen3's real template does,
its tokenizer keeps the tool tags whole, and the calls it teaches read back through mlxchat's reply parser.

The reference is Qwen3's own template (its tokenizer files in assets/), run by transformers; with thinking
off, through mlxchat's ``render_chat_text``, which keeps the empty think block of a reply after the last query
as the recipe's template does (mlxcore.think_blocks).
"""

from __future__ import annotations

import json
import random

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from assets import QWEN3_TOKENIZER_DIR
from mlxcore.chat_template import render_chat_text
from mlxcore.reply_parser import ReplyParser
from recipe import corpus, tasks_tools, tools
from recipe.conversation import TOOL_GROUPS, is_heldout
from recipe.template import render
from recipe.tokenizer import ADDED, train_tokenizer


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer(QWEN3_TOKENIZER_DIR)  # mlx-lm's wrapper, as mlxchat loads it


def tool_conversations(thinking: bool, count: int = 12) -> list[corpus.Conversation]:
    """Corpus conversations with tools offered, of every tool group, with no earlier turns."""
    rng, out = random.Random(7), []
    while len(out) < count:
        conv = corpus.make_conversation(rng, thinking)
        if conv.group in TOOL_GROUPS and sum(m["role"] == "user" for m in conv.messages) == 1:
            out.append(conv)
    return out


def by_hand() -> list[dict]:
    """A system prompt, a question, a call with reasoning, its result, the answer, a new question."""
    task = tasks_tools.calculator(random.Random(3), tasks_tools.random_clock(random.Random(4)))
    return [{"role": "system", "content": "You are Kalo."}, {"role": "user", "content": task.user},
            tools.call_message(task.plan, [(task.name, task.arguments)]), {"role": "tool", "content": task.result},
            {"role": "assistant", "content": f"<think>\n{task.reading}\n</think>\n\n{task.answer}"},
            {"role": "user", "content": "Thanks!"}]


@pytest.mark.parametrize("thinking", [True, False])
def test_tool_conversations_render_as_qwen3s_template_writes_them(qwen3, thinking):
    for conv in tool_conversations(thinking):
        for upto, prompt in ((len(conv.messages) - 1, True), (len(conv.messages), False)):
            messages = conv.messages[:upto]
            want = render_chat_text(qwen3, messages, enable_thinking=thinking, add_generation_prompt=prompt,
                                    tools=conv.tools)
            got = render(messages, conv.tools, add_generation_prompt=prompt, enable_thinking=thinking)
            assert got == want, f"{conv.group}, thinking {thinking}, {upto} messages"


@pytest.mark.parametrize("upto", [3, 4, 5, 6])
def test_a_round_trip_with_a_system_prompt_renders_as_qwen3s(qwen3, upto):
    offered = [tools.CALCULATOR, tools.GET_TIME]
    want = qwen3.apply_chat_template(by_hand()[:upto], tools=offered, tokenize=False, add_generation_prompt=True)
    assert render(by_hand()[:upto], offered, add_generation_prompt=True) == want


def test_without_tools_the_rendering_is_unchanged(qwen3):
    messages = [m for m in by_hand() if m["role"] in ("system", "user")][:2]
    assert "# Tools" not in render(messages, add_generation_prompt=True)
    assert render(messages, add_generation_prompt=True) == qwen3.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


def test_the_taught_call_reads_back_through_the_reply_parser():
    for conv in tool_conversations(thinking=True):
        if conv.group != "tool call":
            continue
        parser = ReplyParser(conv.tools)
        parser.feed(render([conv.messages[-1]]).split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n"))
        parser.finish()
        calls = [(call.name, call.parsed_arguments()) for call in parser.calls]
        assert calls == [(task.name, task.arguments) for task in conv.tool_tasks]
        assert conv.expected == tools.call_text(calls)


def test_tool_tags_are_single_tokens_and_the_vocabulary_keeps_its_size():
    texts = [render(c.messages, c.tools) for c in tool_conversations(True) + tool_conversations(False)]
    tok = train_tokenizer(texts * 3, 600)
    assert tok.get_vocab_size() == 600
    for tag in ADDED:
        assert tok.encode(f"x{tag}y").tokens[1] == tag


def test_tools_compute_what_the_answers_say():
    assert tools.calculate("48213 * 9127") == 440040051
    assert tools.calculate("100 - 7 + 2") == 95
    with pytest.raises(ValueError):
        tools.calculate("__import__('os')")
    assert tools.run("convert_units", {"value": 26, "from": "miles", "to": "kilometers"}, None) == \
        '{"value": 41.84, "unit": "kilometers"}'
    assert json.loads(tools.run("get_time", {}, tools.Clock("2026-11-26", "14:05", "Thursday")))["time"] == "14:05"
    assert tools.number_text(212.0) == "212" and tools.number_text(-0.001) == "0"


def test_tool_tasks_split_on_reserved_phrasings():
    rng = random.Random(5)
    for _ in range(300):
        task = tasks_tools.random_tool_task(rng)
        assert is_heldout(task.key) == task.key[2]
    seen = {corpus.make_conversation(random.Random(s), True).group for s in range(400)}
    assert set(TOOL_GROUPS) <= seen


def test_the_round_trip_runs_the_models_call_and_checks_the_answer_to_its_result(qwen3, monkeypatch):
    from recipe import tool_eval

    conv = next(c for c in tool_conversations(thinking=True) if c.group == "tool call" and len(c.tool_tasks) == 1)
    [task] = conv.tool_tasks
    prompts = []

    def answer(model, prompt, eos):  # a model that reads the result right
        prompts.append(qwen3.decode(prompt))
        return qwen3.encode(f"<think>\n{task.reading}\n</think>\n\n{task.answer}<|im_end|>", add_special_tokens=False)

    monkeypatch.setattr(tool_eval, "greedy", answer)
    row = {"question": task.user, "text": f"<think>\n{task.plan}\n</think>\n\n{conv.expected}<|im_end|>"}
    trip = tool_eval.round_trip(None, qwen3, row, conv)
    assert trip["call ok"] and trip["answer ok"]
    assert prompts[0].endswith(f"<tool_response>\n{task.result}\n</tool_response><|im_end|>\n"
                               "<|im_start|>assistant\n")
    assert prompts[0] == render(conv.messages + [{"role": "tool", "content": task.result}], conv.tools,
                                add_generation_prompt=True, enable_thinking=True)
    wrong = {**row, "text": row["text"].replace('"arguments": {', '"arguments": {"x": 1, ', 1)}
    assert not tool_eval.round_trip(None, qwen3, wrong, conv)["call ok"] and len(prompts) == 1


@pytest.mark.parametrize("thinking", [True, False])
def test_two_questions_at_once_teach_two_calls_and_an_answer_to_both_results(qwen3, thinking, monkeypatch):
    from recipe import tool_eval

    rng, pairs = random.Random(11), {}
    while len(pairs) < 2:
        conv = corpus.make_conversation(rng, thinking)
        if conv.group in ("tool call", "tool answer") and len(conv.tool_tasks) == 2:
            pairs[conv.group] = conv
    answer = pairs["tool answer"]
    want = render_chat_text(qwen3, answer.messages, enable_thinking=thinking, add_generation_prompt=False,
                            tools=answer.tools)
    assert render(answer.messages, answer.tools, enable_thinking=thinking) == want
    assert want.count("<tool_response>") == 2 and answer.expected == " ".join(t.answer for t in answer.tool_tasks)
    call = pairs["tool call"]
    reasoning = f"<think>\n{call.messages[-1]['content'].split('<think>')[1].split('</think>')[0].strip()}\n</think>\n\n"
    monkeypatch.setattr(tool_eval, "greedy", lambda model, prompt, eos: qwen3.encode(
        " ".join(t.answer for t in call.tool_tasks) + "<|im_end|>", add_special_tokens=False))
    trip = tool_eval.round_trip(None, qwen3, {"question": "", "text": reasoning + call.expected + "<|im_end|>"}, call)
    assert trip["calls"] == 2 and trip["call ok"] and trip["answer ok"]
    one = call.expected.split("\n<tool_call>")[0]
    assert not tool_eval.round_trip(None, qwen3, {"question": "", "text": reasoning + one + "<|im_end|>"}, call)["call ok"]

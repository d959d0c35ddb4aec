"""The embedded pair calls tools by itself (its training: recipe/README.md, "Tools"), nothing scripted: the
official openai client and LangChain against a real `mlxchat serve` on the pair, on a loopback port.

The tools are the ones it learned (``app.mcp.demo_tools``), sent as any client sends OpenAI function tools;
the questions use phrasings the models were trained on, and are ones it gets right (greedy): these tests show
the path works end to end, its accuracy is measured by ``python -m recipe evaluate`` (assets/models/README.md).
A round trip: the question, the pair's own call, the tool run on it by the test, the result sent back, and
the pair's answer read from it.
"""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from serve_process import MODEL, PAIR, ServeProcess

from app.mcp import demo_tools as tools

CLOCK = tools.Clock("2026-11-27", "14:05", "Friday")


def thinking(on: bool) -> dict:
    return {"chat_template_kwargs": {"enable_thinking": on}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("trained"), pair=PAIR) as running:
        yield running


def ask(server, messages, offered, think, **kwargs):
    return server.client().chat.completions.create(model=MODEL, messages=messages, tools=offered, temperature=0,
                                                   max_tokens=300, extra_body=thinking(think), **kwargs)


@pytest.mark.parametrize("think", [False, True])
def test_the_pair_calls_the_calculator_and_answers_from_its_result(server, think):
    messages = [{"role": "user", "content": "What is 417 * 386?"}]
    reply = ask(server, messages, [tools.CALCULATOR, tools.GET_TIME], think).choices[0]
    assert reply.finish_reason == "tool_calls"
    [call] = reply.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert (call.function.name, arguments) == ("calculator", {"expression": "417 * 386"})
    messages += [reply.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": tools.run("calculator", arguments, CLOCK)}]
    answer = ask(server, messages, [tools.CALCULATOR, tools.GET_TIME], think).choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert answer.message.content == "417 × 386 = 160962."


def test_a_streamed_call_and_a_streamed_answer(server):
    messages = [{"role": "user", "content": "What is 312 times 457?"}]
    calls: dict[int, dict] = {}
    for chunk in ask(server, messages, [tools.CALCULATOR], False, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or []:
            into = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            into["name"] += delta.function.name or ""
            into["arguments"] += delta.function.arguments or ""
    [call] = calls.values()
    assert (call["name"], json.loads(call["arguments"])) == ("calculator", {"expression": "312 * 457"})
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
                 {"role": "tool", "tool_call_id": call["id"],
                  "content": tools.run(call["name"], json.loads(call["arguments"]), CLOCK)}]
    text = "".join(chunk.choices[0].delta.content or ""
                   for chunk in ask(server, messages, [tools.CALCULATOR], False, stream=True))
    assert text == "312 × 457 = 142584."


def test_two_questions_stream_two_parallel_calls_and_the_round_trip_completes(server):
    messages = [{"role": "user", "content": "What is 417 * 386? What time is it?"}]
    calls: dict[int, dict] = {}
    for chunk in ask(server, messages, [tools.CALCULATOR, tools.GET_TIME], False, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or []:
            into = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            into["name"] += delta.function.name or ""
            into["arguments"] += delta.function.arguments or ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("calculator", {"expression": "417 * 386"}), ("get_time", {})]
    assert len({c["id"] for c in calls.values()}) == 2
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls.values()]})
    messages += [{"role": "tool", "tool_call_id": c["id"],
                  "content": tools.run(c["name"], json.loads(c["arguments"]), CLOCK)} for c in calls.values()]
    answer = ask(server, messages, [tools.CALCULATOR, tools.GET_TIME], False).choices[0]
    # the answer to two results is rarely right (0 of 20 held out, the model card): only that it is one
    assert answer.finish_reason == "stop" and not answer.message.tool_calls and answer.message.content


def test_a_question_that_needs_no_tool_gets_no_call(server):
    reply = ask(server, [{"role": "user", "content": "What is 12 + 7?"}], [tools.CALCULATOR], False).choices[0]
    assert reply.finish_reason == "stop" and not reply.message.tool_calls
    assert reply.message.content.endswith("12 + 7 = 19.")


@pytest.mark.parametrize("streaming", [False, True])
def test_langchain_bind_tools_completes_a_round_trip(server, streaming):
    model = ChatOpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key="none", temperature=0, max_tokens=300,
                       max_retries=0, timeout=60, streaming=streaming, extra_body=thinking(False))
    with_tools = model.bind_tools([tools.CALCULATOR])  # an OpenAI tool dict, sent as it is
    messages = [HumanMessage("What is 725 + 418?")]
    asked = with_tools.invoke(messages)
    assert [(c["name"], c["args"]) for c in asked.tool_calls] == [("calculator", {"expression": "725 + 418"})]
    [call] = asked.tool_calls
    messages += [asked, ToolMessage(tools.run(call["name"], call["args"], CLOCK), tool_call_id=call["id"])]
    answer = with_tools.invoke(messages)
    assert answer.content == "725 + 418 = 1143." and not answer.tool_calls

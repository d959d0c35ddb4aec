"""The HTTP side's own logic, without a server: stop strings held back, reasoning split, chat history."""

from __future__ import annotations

from app.serve.choices import ChoiceState, Delta, coalesce, completion_logprobs, held_back
from app.serve.prompts import with_empty_blocks
from mlxcore import CallDelta
from mlxcore.events import FinalEvent, GenerationStats, TokenEvent
from mlxcore.think_blocks import EMPTY


def feed(choice: ChoiceState, deltas: list[str], final_text: str, reason: str) -> list[str]:
    """The content deltas a client would see."""
    sent = [choice.feed(TokenEvent(token=i, text=d, logprob=-0.1)).content for i, d in enumerate(deltas)]
    return sent + [choice.feed(FinalEvent(reason, final_text, GenerationStats())).content]


def test_a_stop_string_across_tokens_never_reaches_the_client():
    choice = ChoiceState(0, split=False, stops=("7 =",))
    # the engine streams "7" before it knows " =" follows; then its delta and final text stop before "7 ="
    sent = feed(choice, ["Ones: 2 + ", "7", ""], "Ones: 2 + ", "stop")
    assert "".join(sent) == choice.content == "Ones: 2 + "
    assert all("7" not in part for part in sent)
    assert choice.finish_reason == "stop"


def test_text_held_for_a_stop_string_is_sent_when_it_is_not_one():
    choice = ChoiceState(0, split=False, stops=("7 =",))
    sent = feed(choice, ["a 7", " +", " 1"], "a 7 + 1", "eos")
    assert sent[0] == "a " and sent[1] == "7 +" and "".join(sent) == "a 7 + 1"


def test_held_back_is_the_longest_start_of_a_stop_string():
    assert held_back("abc 7", ("7 =", "c 7 x")) == 3
    assert held_back("abc", ("7 =",)) == 0 and held_back("", ("x",)) == 0


def test_reasoning_and_answer_are_split_as_they_stream():
    choice = ChoiceState(0)
    for i, text in enumerate(["<thi", "nk>\nstep one", "</th", "ink>\n\nAnswer", "."]):
        choice.feed(TokenEvent(token=i, text=text, logprob=-0.1))
    choice.feed(FinalEvent("eos", "", GenerationStats()))
    assert (choice.reasoning, choice.content, choice.tokens) == ("\nstep one", "Answer.", 5)


def test_thinking_off_history_keeps_the_empty_block_the_reply_was_written_after():
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "assistant", "content": "<think>\nx\n</think>\n\nYes."}]
    kept = with_empty_blocks(messages)
    assert kept[0] == messages[0] and kept[1]["content"] == EMPTY + "Hello." and kept[2] == messages[2]


def test_completion_logprobs_offsets_follow_the_text():
    from app.serve.choices import TokenLogprob
    texts = {1: "Hel", 2: "lo", 3: "!"}
    entries = [TokenLogprob(1, -0.5, ((1, -0.5), (3, -2.0))), TokenLogprob(2, -0.1), TokenLogprob(3, -0.2)]
    logprobs = completion_logprobs(entries, texts.__getitem__, offset=4)
    assert logprobs["tokens"] == ["Hel", "lo", "!"] and logprobs["text_offset"] == [4, 7, 9]
    assert logprobs["top_logprobs"][0] == {"Hel": -0.5, "!": -2.0}


def test_request_fields_override_the_servers_defaults_and_only_those():
    from app.serve.prompts import generation_params
    from app.serve.schemas import ChatCompletionRequest
    from mlxcore.params import GenerationParams
    defaults = GenerationParams(temperature=0.6, top_p=0.95, top_k=20, max_tokens=100)  # model card, --max-tokens
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.0,
                                 stop="x")
    params = generation_params(body, defaults, body.reply_cap)
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens, params.stop) == (0.0, 0.95, 20, 100,
                                                                                                ("x",))
    assert generation_params(body, defaults, 7).max_tokens == 7


def test_a_messages_stream_keeps_alive_with_anthropics_own_ping_event():
    """(Anthropic's SDK skips ping events, so test_serve_pings cannot see which keep-alive came.)"""
    from sse_starlette.sse import ensure_bytes

    from app.serve.anthropic_stream import _ping
    assert ensure_bytes(_ping(), "\r\n") == b'event: ping\r\ndata: {"type":"ping"}\r\n\r\n'


def test_requests_asking_for_one_grammar_at_once_share_one_compile(monkeypatch):
    """Twenty requests with one schema (as instructor sends them) compile it once, not 20 times in a queue
    that refuses the last ones after COMPILE_SECONDS; another schema is compiled for itself."""
    import asyncio
    import threading
    import time
    from collections import OrderedDict

    from app.serve import grammars
    from app.serve.schemas import ChatCompletionRequest
    from app.serve.state import ModelInfo
    from mlxcore import GenerationParams

    calls: list[str] = []
    lock = threading.Lock()

    def compile_matcher(grammar, tokenizer, vocab, eos_ids):
        with lock:
            calls.append(grammar.text)
        time.sleep(0.05)
        return object()

    monkeypatch.setattr(grammars, "compile_matcher", compile_matcher)
    monkeypatch.setattr(grammars, "_compiles", OrderedDict(), raising=False)  # (none kept from other tests)
    model = ModelInfo(id="m", tokenizer=object(), default_params=GenerationParams(), vocab_size=10, context_length=99)

    def body(maximum: int) -> ChatCompletionRequest:
        schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": maximum}}}
        return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                     "response_format": {"type": "json_schema", "json_schema": {
                                                         "name": "x", "schema": schema}}})

    async def twenty_and_one() -> list:
        return await asyncio.gather(*[grammars.request_grammar(body(9), model) for _ in range(20)],
                                    grammars.request_grammar(body(8), model))

    got = asyncio.run(twenty_and_one())
    assert len(calls) == 2 and len(set(calls)) == 2, f"{len(calls)} compiles"
    assert all(grammar.compiled is got[0].compiled for grammar in got[:20]) and got[20].compiled is not None


ADD = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def test_a_rounds_tokens_go_out_as_one_delta_that_says_what_theirs_said():
    choice = ChoiceState(0, tools=ADD)
    texts = ["<think>", "\nsum", "</think>", "\n\nLet me add.", "\n<tool_call>", '\n{"name": "add", ',
             '"arguments": {"a": 1', "}}\n</tool_call>"]
    each = [choice.feed(TokenEvent(token=i, text=text, logprob=-0.1 * i)) for i, text in enumerate(texts)]
    each.append(choice.feed(FinalEvent("eos", "", GenerationStats())))
    (one,) = coalesce(each)
    assert one.reasoning == "".join(d.reasoning for d in each) == "\nsum"
    assert one.content == "".join(d.content for d in each) == "Let me add."
    assert [lp.token for lp in one.logprobs] == list(range(len(texts)))  # every token's logprob, in order
    assert one.finish_reason == "tool_calls"
    (call,) = one.tool_calls  # the call's id and name, then all its arguments, in one piece
    assert (call.id, call.name) == (choice.tool_calls[0].id, "add")
    assert call.arguments == "".join(c.arguments for d in each for c in d.tool_calls) == '{"a": 1}'


def test_deltas_that_one_chunk_would_reorder_stay_apart():
    call = CallDelta(0, "call_1", "add", '{"a"')
    pieces = [Delta(tool_calls=(call,)), Delta(tool_calls=(CallDelta(0, arguments=": 1}"),)), Delta(content="done"),
              Delta(reasoning="hm"), Delta(content="!", finish_reason="stop"), Delta(content="late")]
    merged = coalesce(pieces)
    # text after a call, reasoning after text, anything after the finish: each starts a chunk of its own
    assert [(d.reasoning, d.content, [c.arguments for c in d.tool_calls]) for d in merged] == [
        ("", "", ['{"a": 1}']), ("", "done", []), ("hm", "!", []), ("", "late", [])]
    assert merged[2].finish_reason == "stop"

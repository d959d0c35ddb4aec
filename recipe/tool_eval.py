"""Tool use, end to end: the call the target writes, the tool run on it, and the answer it gives to the result."""

from __future__ import annotations

from collections import defaultdict

from mlxcore.reply_parser import ReplyParser
from recipe import tools
from recipe.decode import greedy

CALL_OPEN = "<tool_call>"


def read_calls(text: str, offered: list[dict]) -> list:
    """The calls in a generated reply, read by mlxchat's own reply parser."""
    parser = ReplyParser(offered)
    parser.feed(text.removesuffix("<|im_end|>"))
    parser.finish()
    return list(parser.calls)


def round_trip(model, tokenizer, row: dict, conv) -> dict:
    """Check the calls in ``row`` (the target's reply to a "tool call" task); if right, answer their results."""
    tasks = conv.tool_tasks
    calls = read_calls(row["text"], conv.tools)
    call_ok = ([(c.name, c.parsed_arguments()) for c in calls] == [(t.name, t.arguments) for t in tasks]
               and row["text"].endswith("</tool_call><|im_end|>"))
    out = {"thinking": conv.thinking, "question": row["question"], "call": row["text"], "call ok": call_ok,
           "calls": len(tasks), "answer": "", "answer ok": False}
    if not call_ok:
        return out
    reasoning = row["text"].split(CALL_OPEN)[0]
    messages = conv.messages[:-1] + [
        {"role": "assistant", "content": reasoning, "tool_calls": [c.as_dict() for c in calls]},
        *({"role": "tool", "content": tools.run(t.name, c.parsed_arguments(), t.clock)} for t, c in zip(tasks, calls))]
    prompt = tokenizer.apply_chat_template(messages, tools=conv.tools, add_generation_prompt=True,
                                           enable_thinking=conv.thinking)
    text = tokenizer.decode(greedy(model, prompt, tokenizer.eos_token_id), skip_special_tokens=False)
    out["answer"] = text
    out["answer ok"] = text.split("</think>")[-1].removesuffix("<|im_end|>").strip("\n") == \
        " ".join(t.answer for t in tasks) and text.endswith("<|im_end|>")
    return out


def tool_report(model, tokenizer, rows: list[dict], convs: list) -> dict:
    """Call accuracy, answer accuracy after the model's own call, and calls made where none was needed."""
    trips = [round_trip(model, tokenizer, r, c) for r, c in zip(rows, convs) if c.group == "tool call"]
    table: dict[str, list[bool]] = defaultdict(list)
    for name, right in (("call right", lambda t: t["call ok"]),
                        ("call and answer right", lambda t: t["call ok"] and t["answer ok"])):
        for mode, thinking in (("all", None), ("thinking on", True), ("thinking off", False)):
            table[f"{name} ({mode})"] = [right(t) for t in trips if thinking in (None, t["thinking"])]
        table[f"{name} (two calls)"] = [right(t) for t in trips if t["calls"] == 2]
    for r, c in zip(rows, convs):
        if c.group == "tool direct":
            table["no call when not needed"].append(CALL_OPEN not in r["text"])
        elif c.tools is None:
            table["no call without tools"].append(CALL_OPEN not in r["text"])
    return {"rates": {k: (sum(v) / len(v), len(v)) for k, v in table.items() if v},
            "failures": [t for t in trips if not (t["call ok"] and t["answer ok"])]}

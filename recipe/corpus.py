"""The synthetic chat corpus: conversations in Qwen3's message form, split into train and held-out."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from recipe import tasks_tools, tools
from recipe.conversation import (GROUP_WEIGHTS, GROUPS, RECALL, TOOL_GROUPS, Persona, is_heldout, random_task,
                                 recall_value, roughen)
from recipe.tasks_tools import ToolTask


@dataclass(frozen=True)
class Conversation:
    """Messages ending with the assistant reply the models learn (and the evaluation checks)."""

    group: str             # task type of the final question
    key: tuple             # instance key of the final question (decides the split)
    thinking: bool         # whether the final reply was made with thinking on
    messages: list[dict]   # system/user/assistant/tool messages; assistant content holds <think>...</think>
    expected: str          # the final reply's visible text (a call's is its <tool_call> text)
    tools: list[dict] | None = None   # the tools offered (OpenAI function tools), if any
    tool_tasks: tuple[ToolTask, ...] = ()  # the tasks behind a "tool call" or "tool answer" conversation (1-2)

    def to_json(self) -> str:
        return json.dumps({"group": self.group, "key": repr(self.key), "thinking": self.thinking,
                           "messages": self.messages, "expected": self.expected, "tools": self.tools})


def assistant(thought: str, visible: str) -> dict:
    return {"role": "assistant", "content": f"<think>\n{thought}\n</think>\n\n{visible}"}


def _context_turns(rng: random.Random, persona: Persona, thinking: bool, count: int) -> list[dict]:
    """Earlier question/answer pairs; the template later drops their reasoning."""
    messages = []
    for _ in range(count):
        group = rng.choices(GROUPS[:5], k=1)[0]
        task = random_task(rng, group, persona)
        messages += [{"role": "user", "content": roughen(rng, task.user)}, assistant(*persona.reply(task, thinking))]
    return messages


def _recall(rng: random.Random, persona: Persona, thinking: bool) -> tuple[tuple, list[dict], str, str]:
    slot = rng.randrange(len(RECALL))
    value = recall_value(rng, slot)
    statement, ack, question, answer, why = (part.format(v=value) for part in RECALL[slot])
    key = ("recall", slot, answer)
    first = [{"role": "user", "content": roughen(rng, statement)}, assistant(*persona.reply_text("", ack, False))]
    middle = _context_turns(rng, persona, thinking, rng.choice([0, 0, 1, 2]))
    thought, visible = persona.reply_text(why, answer, thinking)
    return key, first + middle + [{"role": "user", "content": roughen(rng, question)}], thought, visible


def _tool_conversation(rng: random.Random, group: str, thinking: bool) -> Conversation:
    """Tools offered: a task that needs one (ending with the call, or with the answer to its result), or not."""
    persona = Persona(rng, styles=False)
    system = [{"role": "system", "content": persona.system}] if persona.system else []
    earlier = _context_turns(rng, persona, thinking, rng.choices([0, 1], weights=[80, 20])[0])
    if group == "tool direct":
        task = random_task(rng, rng.choices(GROUPS[:5], k=1)[0], persona)
        user = roughen(rng, task.user)
        key = task.key if task.open_key else (task.key, user, persona.system)
        thought, visible = persona.reply(task, thinking)
        messages = system + earlier + [{"role": "user", "content": user}, assistant(thought, visible)]
        return Conversation(group, key, thinking, messages, visible, tasks_tools.offered(rng, []))
    tasks = tasks_tools.random_tool_tasks(rng)
    # Two questions are held out when either phrasing is: no held-out phrasing is ever seen with a tool.
    key = tasks[0].key if len(tasks) == 1 else ("tool", "pair", any(t.key[2] for t in tasks), tasks)
    offered = tasks_tools.offered(rng, [t.name for t in tasks])
    calls = [(t.name, t.arguments) for t in tasks]
    call = tools.call_message("\n".join(t.plan for t in tasks) if thinking else "", calls)
    user = " ".join(roughen(rng, t.user) for t in tasks)
    messages = system + earlier + [{"role": "user", "content": user}, call]
    if group == "tool call":
        return Conversation(group, key, thinking, messages, tools.call_text(calls), offered, tasks)
    answer = " ".join(t.answer for t in tasks)
    messages += [{"role": "tool", "content": t.result} for t in tasks]
    messages.append(assistant("\n".join(t.reading for t in tasks) if thinking else "", answer))
    return Conversation(group, key, thinking, messages, answer, offered, tasks)


def make_conversation(rng: random.Random, thinking: bool) -> Conversation:
    """One random conversation whose last turn is a checkable task."""
    group = rng.choices(GROUPS, weights=GROUP_WEIGHTS, k=1)[0]
    if group in TOOL_GROUPS:
        return _tool_conversation(rng, group, thinking)
    persona = Persona(rng)
    if group == "recall":
        key, messages, thought, visible = _recall(rng, persona, thinking)
    else:
        task = random_task(rng, group, persona)
        user = roughen(rng, task.user)
        key = task.key if task.open_key else (task.key, user, persona.system)
        earlier = _context_turns(rng, persona, thinking, rng.choices([0, 1, 2], weights=[70, 20, 10])[0])
        messages = earlier + [{"role": "user", "content": user}]
        thought, visible = persona.reply(task, thinking)
        if persona.styled:
            group = "persona"
    if persona.system:
        messages = [{"role": "system", "content": persona.system}] + messages
    return Conversation(group, key, thinking, messages + [assistant(thought, visible)], visible)


def generate(seed: int, count: int, heldout: bool, groups: list[str] | None = None) -> list[Conversation]:
    """``count`` conversations from one side of the split, half with thinking on."""
    rng = random.Random(seed)
    out: list[Conversation] = []
    while len(out) < count:
        conv = make_conversation(rng, thinking=len(out) % 2 == 0)
        if is_heldout(conv.key) == heldout and (groups is None or conv.group in groups):
            out.append(conv)
    return out


def heldout_pairs(seed: int, per_group: int) -> list[tuple[Conversation, Conversation]]:
    """Held-out tasks, ``per_group`` of each type, each as (thinking on, thinking off) conversations."""
    rng = random.Random(seed)
    counts = dict.fromkeys(GROUPS, 0)
    pairs = []
    while len(pairs) < per_group * len(GROUPS):
        state = rng.getstate()
        on = make_conversation(rng, thinking=True)
        rng.setstate(state)  # replay the same draws: the choices do not depend on the mode
        off = make_conversation(rng, thinking=False)
        assert on.key == off.key
        if is_heldout(on.key) and counts[on.group] < per_group:
            counts[on.group] += 1
            pairs.append((on, off))
    return pairs


def write_jsonl(conversations: list[Conversation], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(c.to_json() + "\n" for c in conversations))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]

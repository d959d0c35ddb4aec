"""Tasks that need a tool: large arithmetic (calculator), the clock (get_time), unit conversion (convert_units).

Each phrasing list ends with RESERVED phrasings that only the held-out set uses, so the evaluation asks
in words the models never saw with a tool.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from recipe import tools
from recipe.tasks_math import ADD_Q, MUL_Q, SUB_Q
from recipe.task import pick

RESERVED = 2  # the last phrasings of each list: held out

TIME_Q = ["What time is it?", "What's the time?", "Tell me the current time.", "what time is it now",
          "Do you know what time it is?", "Can you check the time?", "Got the time?", "What is the time right now?"]
DATE_Q = ["What's the date today?", "What is today's date?", "Which date is it today?", "what's the date",
          "Tell me today's date.", "What date is it?", "Give me the date, please."]
DAY_Q = ["What day of the week is it?", "Which day is it today?", "What weekday is it today?",
         "what day of the week is it", "Tell me the day of the week.", "Which weekday is today?"]
CONVERT_Q = ["Convert {n} {src} to {dst}.", "How many {dst} are in {n} {src}?", "What is {n} {src} in {dst}?",
             "Express {n} {src} in {dst}.", "how many {dst} is {n} {src}", "{n} {src} equals how many {dst}?",
             "I have {n} {src}. How much is that in {dst}?"]
SINGULAR = {"miles": "mile", "kilometers": "kilometer", "pounds": "pound", "kilograms": "kilogram",
            "inches": "inch", "feet": "foot", "meters": "meter", "gallons": "gallon", "ounces": "ounce"}
SAID = {"fahrenheit": "degrees Fahrenheit", "celsius": "degrees Celsius"}  # how a unit is written in text
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


@dataclass(frozen=True)
class ToolTask:
    """A question answered through one tool call: the call, the tool's reply, the answer that reads it."""

    key: tuple          # ("tool", kind, held-out phrasing?, instance): decides the split
    user: str           # the question
    plan: str           # reasoning before the call (thinking on)
    name: str           # the tool called
    arguments: dict     # its arguments
    clock: tools.Clock  # what get_time reports in this conversation
    reading: str        # reasoning after the tool's reply (thinking on)
    answer: str         # the final reply, checked by exact match

    @property
    def result(self) -> str:
        return tools.run(self.name, self.arguments, self.clock)


def _phrasing(rng: random.Random, options: list[str]) -> tuple[str, bool]:
    i = rng.randrange(len(options))
    return options[i], i >= len(options) - RESERVED


def random_clock(rng: random.Random) -> tools.Clock:
    day = rng.randint(1, 28)
    date = f"{rng.randint(2024, 2030)}-{rng.randint(1, 12):02d}-{day:02d}"
    return tools.Clock(date, f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}", pick(rng, WEEKDAYS))


def calculator(rng: random.Random, clock: tools.Clock) -> ToolTask:
    """Numbers too large for the models' digit-by-digit steps (those stop at two digits), and no larger: copying
    5-digit runs was beyond the models and blurred their copying everywhere (recipe/README.md, "Tools")."""
    op = rng.randrange(3)
    a, b = sorted((rng.randint(100, 999), rng.randint(100, 999)), reverse=op == 1)
    symbol, shown, options = [("+", "+", ADD_Q), ("-", "-", SUB_Q), ("*", "×", MUL_Q)][op]
    template, held = _phrasing(rng, options)
    expression = f"{a} {symbol} {b}"
    value = tools.calculate(expression)
    return ToolTask(("tool", "calculator", held, a, symbol, b), template.format(a=a, b=b),
                    f"{a} {shown} {b} is too large to work out digit by digit, so I use the calculator.",
                    "calculator", {"expression": expression}, clock,
                    f"The calculator returned {value}.", f"{a} {shown} {b} = {value}.")


def clock_question(rng: random.Random, clock: tools.Clock) -> ToolTask:
    kind = rng.randrange(3)
    options, field, value = [(TIME_Q, "time", clock.time), (DATE_Q, "date", clock.date),
                             (DAY_Q, "weekday", clock.weekday)][kind]
    template, held = _phrasing(rng, options)
    answer = f"It is {value}." if kind == 0 else f"Today is {value}."
    return ToolTask(("tool", "get_time", held, field, value), template,
                    f"I cannot know the current {field} myself, so I call get_time.", "get_time", {}, clock,
                    f"get_time says the {field} is {value}.", answer)


def conversion(rng: random.Random, clock: tools.Clock) -> ToolTask:
    pairs = list(tools.FACTORS) + list(tools.TEMPERATURES)
    source, target = pairs[rng.randrange(len(pairs))]
    n = rng.randint(1, 500)
    template, held = _phrasing(rng, CONVERT_Q)
    src = SAID.get(source) or (SINGULAR[source] if n == 1 else source)
    dst = SAID.get(target, target)
    arguments = {"value": n, "from": source, "to": target}
    result = tools.number_text(tools.convert(n, source, target))
    return ToolTask(("tool", "convert_units", held, n, source, target), template.format(n=n, src=src, dst=dst),
                    f"Converting {src} to {dst} is not in my table, so I use convert_units.",
                    "convert_units", arguments, clock,
                    f"convert_units returned {result} {target}.", f"{n} {src} is {result} {dst}.")


MAKERS = [calculator, calculator, clock_question, conversion]


PARALLEL = 0.2  # the share of tool questions that ask two things at once: two calls in one reply


def random_tool_task(rng: random.Random) -> ToolTask:
    return pick(rng, MAKERS)(rng, random_clock(rng))


def random_tool_tasks(rng: random.Random) -> tuple[ToolTask, ...]:
    """One tool question, or (``PARALLEL``) two asked in one message, under one clock."""
    clock = random_clock(rng)
    return tuple(pick(rng, MAKERS)(rng, clock) for _ in range(2 if rng.random() < PARALLEL else 1))


def offered(rng: random.Random, needed: list[str]) -> list[dict]:
    """The tools of one conversation: the needed ones, mostly alone, else among others (one tool keeps the
    prompt short; the others teach picking by name), in a random order."""
    others = [n for n in tools.TOOLS if n not in needed]
    extra = rng.choices([0, 1, 2], weights=[60, 30, 10])[0] if needed else rng.choices([1, 2], weights=[70, 30])[0]
    chosen = list(dict.fromkeys(needed)) + rng.sample(others, min(extra, len(others)))
    rng.shuffle(chosen)
    return [tools.TOOLS[n] for n in chosen]

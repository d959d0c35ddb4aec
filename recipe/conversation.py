"""Whole conversations: system prompts (name, style), earlier turns, recall, phrasing noise."""

from __future__ import annotations

import hashlib
import random

from recipe import tasks_math, tasks_text
from recipe.task import Task, pick

SYLLABLES = ["ka", "lo", "mi", "ra", "ne", "to", "su", "vi", "da", "re", "li", "no", "ma", "te", "zu", "pa",
             "se", "ri", "bo", "fe"]
DEFAULT_NAME = "Mini"


def make_name(rng: random.Random) -> str:
    """A made-up name from thousands: the models must copy names, not memorise a short list."""
    return "".join(pick(rng, SYLLABLES) for _ in range(rng.choice([2, 2, 3]))).capitalize()


GREETINGS = ["Ahoy!", "Greetings!", "Hi there!", "Howdy!"]
SIGNOFFS = ["Cheers!", "Have a nice day!", "Stay curious!", "Good luck!"]
PLAIN_SYSTEM = ["You are a helpful assistant.", "You are a concise assistant."]

MAKERS = {  # group -> (weight, task makers)
    "arithmetic": (0.27, [tasks_math.addition, tasks_math.subtraction, tasks_math.multiplication]),
    "string": (0.20, [tasks_text.reverse, tasks_text.upper, tasks_text.count_letter, tasks_text.length]),
    "units": (0.10, [tasks_math.conversion]),
    "sort": (0.10, [tasks_math.sorting]),
    "facts": (0.12, [tasks_text.capital, tasks_text.legs, tasks_text.planet]),
}
TOOL_GROUPS = ["tool call", "tool answer", "tool direct"]  # the reply is a call; reads a result; needs no tool
GROUPS = list(MAKERS) + ["chat", "persona", "recall"] + TOOL_GROUPS
# Tools are offered in 8% of the conversations (the other groups keep their proportions among the rest): their
# prompts are several times longer, so 8% of the conversations are about a fifth of the tokens.
GROUP_WEIGHTS = [0.92 * w for w, _ in MAKERS.values()] + [0.92 * w for w in (0.03, 0.05, 0.13)] + [0.03, 0.03, 0.02]
HELDOUT_PERCENT = 10


def is_heldout(key: tuple) -> bool:
    """A stable split: the same instance always lands on the same side.

    Tool tasks split on their phrasing instead: the reserved phrasings are held out (tasks_tools.RESERVED).
    """
    if key[0] == "tool":
        return key[2]
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:4], "little") % 100 < HELDOUT_PERCENT


def roughen(rng: random.Random, text: str) -> str:
    """Vary the surface the way people type: lower case, no final punctuation, a lead-in."""
    if rng.random() < 0.1:
        text = pick(rng, ["Please: ", "Hey, ", "Quick question: ", "Can you help? "]) + text
    if rng.random() < 0.2:
        text = text[0].lower() + text[1:]
    if rng.random() < 0.2 and text[-1] in ".?!":
        text = text[:-1]
    return text


class Persona:
    """The system prompt of one conversation and how it shapes every reply (``styles=False``: a name at most,
    no greeting or sign-off to add, as in the conversations that offer tools)."""

    def __init__(self, rng: random.Random, styles: bool = True):
        roll = rng.random()
        self.name, self.prefix, self.suffix, self.system = DEFAULT_NAME, "", "", None
        if roll < 0.55:
            return
        if roll < 0.65:
            self.system = pick(rng, PLAIN_SYSTEM)
            return
        self.name = make_name(rng)
        intro = pick(rng, [f"You are {self.name}, a helpful assistant.", f"Your name is {self.name}.",
                           f"You are {self.name}."])
        style = rng.random() if styles else 1.0
        if style < 0.25:
            self.prefix = pick(rng, GREETINGS)
            intro += f' Always start your reply with "{self.prefix}"'
        elif style < 0.5:
            self.suffix = pick(rng, SIGNOFFS)
            intro += f' End every reply with "{self.suffix}"'
        self.system = intro

    @property
    def styled(self) -> bool:
        return bool(self.prefix or self.suffix)

    def reply(self, task: Task, thinking: bool) -> tuple[str, str]:
        """(reasoning, visible reply) for ``task`` under this system prompt's style."""
        return self.reply_text(task.thought, task.visible(thinking), thinking)

    def reply_text(self, thought: str, visible: str, thinking: bool) -> tuple[str, str]:
        thought = thought if thinking else ""
        if self.prefix:
            visible = f"{self.prefix} {visible}"
            thought = thought and f'The system prompt asks me to start with "{self.prefix}".\n{thought}'
        if self.suffix:
            visible = f"{visible} {self.suffix}"
            thought = thought and f'The system prompt asks me to end with "{self.suffix}".\n{thought}'
        return thought, visible

    def name_task(self, rng: random.Random) -> Task:
        user = pick(rng, ["What is your name?", "Who are you?", "What should I call you?", "what's your name",
                          "Tell me your name."])
        said = (f"The system prompt says my name is {self.name}." if self.name != DEFAULT_NAME
                else f"No name was given to me, so I am {DEFAULT_NAME}.")
        return Task("persona", ("name", self.name), user, said, "", f"My name is {self.name}.", False)


RECALL = [  # (statement, acknowledgement, question, answer, reasoning) with {v} the value
    ("My name is {v}.", "Nice to meet you, {v}!", "What is my name?", "Your name is {v}.",
     "Earlier the user said their name is {v}."),
    ("My favorite word is {v}.", "Got it, your favorite word is {v}.", "What is my favorite word?",
     "Your favorite word is {v}.", "Earlier the user said their favorite word is {v}."),
    ("Please remember the number {v}.", "Okay, I will remember {v}.", "What number did I ask you to remember?",
     "You asked me to remember {v}.", "Earlier the user asked me to remember {v}."),
    ("I live in {v}.", "{v} sounds lovely!", "Where do I live?", "You live in {v}.",
     "Earlier the user said they live in {v}."),
]


def recall_value(rng: random.Random, slot: int) -> str:
    """Values come from large pools, so held-out values are new to the model: it has to copy."""
    if slot == 0:
        return make_name(rng)
    if slot == 1:
        return pick(rng, tasks_text.WORDS)
    if slot == 2:
        return str(rng.randint(100, 999))
    return make_name(rng) + pick(rng, ["ton", "ville", " City", "burg"])


def random_task(rng: random.Random, group: str, persona: Persona) -> Task:
    if group == "chat":
        return tasks_text.small_talk(rng, persona.name)
    if group == "persona":
        return persona.name_task(rng)
    return pick(rng, MAKERS[group][1])(rng)

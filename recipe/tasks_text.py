"""String, fact-table and small-talk tasks."""

from __future__ import annotations

import random

from recipe.facts import CAPITALS, LEGS, ORDINALS, PLANETS
from recipe.task import Task, pick

WORDS = """apple table river stone cloud green house light water paper music tiger horse bread
chair plant night smile train money dream beach field grape lemon mango peach melon onion
candy sugar honey juice pizza salad tomato carrot potato garden forest desert island ocean
planet rocket robot laser pencil eraser window mirror bottle basket bucket candle button
rabbit monkey turtle parrot spider zebra camel panda koala whale shark eagle falcon dragon
castle bridge tunnel market school doctor farmer pilot sailor singer dancer winter summer
spring autumn morning evening silver golden purple orange yellow violet cotton wool metal
glass brick wood sand snow rain wind storm fire frost cat dog sun moon star sky sea tree
book pen cup box hat map key bell ship car bus lamp""".split()

REVERSE_Q = ["Reverse the word {w}.", "What is {w} spelled backwards?", "Write {w} in reverse.",
             "Spell {w} backwards.", "reverse {w}", "Can you reverse the string {w}?"]
UPPER_Q = ["Write {w} in upper case.", "Convert {w} to capital letters.", "What is {w} in uppercase?",
           "uppercase {w}", "Make {w} all caps."]
COUNT_Q = ["How many times does the letter {c} appear in {w}?", "Count the letter {c} in {w}.",
           "How many {c}'s are in {w}?", "count {c} in {w}"]
LENGTH_Q = ["How many letters are in {w}?", "How long is the word {w}?", "Count the letters in {w}.",
            "how many letters does {w} have"]


def _letters(word: str) -> str:
    return ", ".join(word)


def reverse(rng: random.Random) -> Task:
    w = pick(rng, WORDS)
    back = w[::-1]
    thought = f"The word is {w}.\nIts letters: {_letters(w)}.\nBackwards: {_letters(back)}."
    return Task("string", ("reverse", w), pick(rng, REVERSE_Q).format(w=w), thought,
                f"{'-'.join(w)} backwards is {'-'.join(back)}.", f"The reverse of {w} is {back}.", False)


def upper(rng: random.Random) -> Task:
    w = pick(rng, WORDS)
    thought = f"The word is {w}.\nIts letters: {_letters(w)}.\nIn capitals: {_letters(w.upper())}."
    return Task("string", ("upper", w), pick(rng, UPPER_Q).format(w=w), thought,
                f"{'-'.join(w)} in capitals is {'-'.join(w.upper())}.", f"{w} in upper case is {w.upper()}.",
                False)


def count_letter(rng: random.Random) -> Task:
    w = pick(rng, WORDS)
    c = pick(rng, list(w)) if rng.random() < 0.85 else pick(rng, list("bdfhjkqvxz"))
    hits = [x for x in w if x == c]
    n = len(hits)
    found = ", ".join(hits) if hits else "none"
    thought = f"The word is {w}.\nIts letters: {_letters(w)}.\nMatches for {c}: {found}.\nCount: {n}."
    times = "time" if n == 1 else "times"
    return Task("string", ("count", w, c), pick(rng, COUNT_Q).format(w=w, c=c), thought,
                f"{_letters(w)}: matches {found}.", f"The letter {c} appears {n} {times} in {w}.", False)


def length(rng: random.Random) -> Task:
    w = pick(rng, WORDS)
    numbered = ", ".join(f"{x} ({i})" for i, x in enumerate(w, 1))
    thought = f"The word is {w}.\nCounting: {numbered}."
    return Task("string", ("length", w), pick(rng, LENGTH_Q).format(w=w), thought,
                f"Counting: {numbered}.", f"{w} has {len(w)} letters.", False)


CAPITAL_Q = ["What is the capital of {c}?", "Which city is the capital of {c}?", "capital of {c}?",
             "Tell me the capital city of {c}.", "What's {c}'s capital?", "Name the capital of {c}."]
CITY_Q = ["{k} is the capital of which country?", "Which country has {k} as its capital?",
          "What country is {k} the capital of?"]
LEGS_Q = ["How many legs does a {a} have?", "How many legs has a {a} got?", "number of legs of a {a}?",
          "A {a} has how many legs?"]
PLANET_Q = ["Which planet is {o} from the sun?", "What is the {o} planet from the sun?",
            "Name the {o} planet from the sun."]
ORDER_Q = ["What position is {p} from the sun?", "Where is {p} in the order of planets?",
           "How far from the sun is {p} in order?"]


def capital(rng: random.Random) -> Task:
    c = pick(rng, list(CAPITALS))
    k = CAPITALS[c]
    if rng.random() < 0.7:
        return Task("facts", ("capital", c), pick(rng, CAPITAL_Q).format(c=c),
                    f"From my fact table: the capital of {c} is {k}.", "", f"The capital of {c} is {k}.", False)
    return Task("facts", ("city", k), pick(rng, CITY_Q).format(k=k),
                f"From my fact table: {k} is the capital of {c}.", "", f"{k} is the capital of {c}.", False)


def legs(rng: random.Random) -> Task:
    a = pick(rng, list(LEGS))
    n = LEGS[a]
    return Task("facts", ("legs", a), pick(rng, LEGS_Q).format(a=a),
                f"From my fact table: a {a} has {n} legs.", "", f"A {a} has {n} legs.", False)


def planet(rng: random.Random) -> Task:
    i = rng.randrange(len(PLANETS))
    p, o = PLANETS[i], ORDINALS[i]
    order = ", ".join(PLANETS[: i + 1])
    thought = f"The planets in order from the sun: {order}.\n{p} is number {i + 1}."
    if rng.random() < 0.5:
        return Task("facts", ("planet", i), pick(rng, PLANET_Q).format(o=o), thought, "",
                    f"{p} is the {o} planet from the sun.", False)
    return Task("facts", ("order", i), pick(rng, ORDER_Q).format(p=p), thought, "",
                f"{p} is the {o} planet from the sun.", False)


GREET_Q = ["Hello!", "Hi", "Hey there!", "Good morning!", "hello", "Hi, how are you?"]
THANKS_Q = ["Thanks!", "Thank you.", "thanks a lot", "Great, thank you!"]
HELP_Q = ["What can you do?", "What are you able to help with?", "what can you help me with"]


def small_talk(rng: random.Random, name: str) -> Task:
    kind = rng.randrange(3)
    if kind == 0:
        return Task("chat", ("greet",), pick(rng, GREET_Q), "The user greets me, so I greet them back.", "",
                    f"Hello! I am {name}. How can I help you today?", False)
    if kind == 1:
        return Task("chat", ("thanks",), pick(rng, THANKS_Q), "The user thanks me.", "",
                    "You're welcome! Anything else?", False)
    return Task("chat", ("help",), pick(rng, HELP_Q), "The user asks what I can do.", "",
                "I can do arithmetic, convert units, sort numbers, work with words, answer facts "
                "from my table, and remember what you tell me.", False)

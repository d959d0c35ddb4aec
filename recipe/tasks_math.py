"""Arithmetic, unit conversion and sorting tasks, with digit-by-digit worked steps."""

from __future__ import annotations

import random

from recipe.task import Task, pick

ADD_Q = ["What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}.", "Compute {a} + {b}.",
         "How much is {a} plus {b}?", "{a} + {b} = ?", "Calculate {a}+{b}.", "What do you get if you add {a} to {b}?",
         "Find the sum of {a} and {b}.", "what's {a} + {b}"]
SUB_Q = ["What is {a} - {b}?", "What is {a} minus {b}?", "Subtract {b} from {a}.", "Compute {a} - {b}.",
         "How much is {a} minus {b}?", "{a} - {b} = ?", "Calculate {a}-{b}.", "Take {b} away from {a}.",
         "Find the difference between {a} and {b}.", "what's {a} - {b}"]
MUL_Q = ["What is {a} × {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.", "Compute {a} * {b}.",
         "How much is {a} times {b}?", "{a} x {b} = ?", "Calculate {a}*{b}.", "What is the product of {a} and {b}?",
         "what's {a} times {b}"]


def addition(rng: random.Random) -> Task:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    (a1, a0), (b1, b0) = divmod(a, 10), divmod(b, 10)
    ones = a0 + b0
    carry, digit = divmod(ones, 10)
    tens = a1 + b1 + carry
    lines = [f"Add the ones: {a0} + {b0} = {ones}. Write {digit}, carry {carry}.",
             f"Add the tens: {a1} + {b1} + {carry} = {tens}.", f"So {a} + {b} = {a + b}."]
    steps = f"Ones: {a0} + {b0} = {ones}, carry {carry}. Tens: {a1} + {b1} + {carry} = {tens}."
    return Task("arithmetic", ("add", a, b), pick(rng, ADD_Q).format(a=a, b=b), "\n".join(lines),
                steps, f"{a} + {b} = {a + b}.")


def subtraction(rng: random.Random) -> Task:
    a = rng.randint(10, 99)
    b = rng.randint(0, a)
    (a1, a0), (b1, b0) = divmod(a, 10), divmod(b, 10)
    borrow = int(a0 < b0)
    top = a0 + 10 * borrow
    tens = a1 - b1 - borrow
    first = (f"Subtract the ones: {a0} is less than {b0}, so borrow: {top} - {b0} = {top - b0}. Borrow 1."
             if borrow else f"Subtract the ones: {a0} - {b0} = {a0 - b0}. Borrow 0.")
    lines = [first, f"Subtract the tens: {a1} - {b1} - {borrow} = {tens}.", f"So {a} - {b} = {a - b}."]
    steps = f"Ones: {top} - {b0} = {top - b0}, borrow {borrow}. Tens: {a1} - {b1} - {borrow} = {tens}."
    return Task("arithmetic", ("sub", a, b), pick(rng, SUB_Q).format(a=a, b=b), "\n".join(lines),
                steps, f"{a} - {b} = {a - b}.")


def multiplication(rng: random.Random) -> Task:
    a, b = rng.randint(10, 99), rng.randint(2, 9)
    a1, a0 = divmod(a, 10)
    carry, digit = divmod(a0 * b, 10)
    tens = a1 * b
    lines = [f"Multiply the ones: {a0} × {b} = {a0 * b}. Write {digit}, carry {carry}.",
             f"Multiply the tens: {a1} × {b} = {tens}, then {tens} + {carry} = {tens + carry}.",
             f"So {a} × {b} = {a * b}."]
    steps = f"Ones: {a0} × {b} = {a0 * b}, carry {carry}. Tens: {a1} × {b} + {carry} = {tens + carry}."
    return Task("arithmetic", ("mul", a, b), pick(rng, MUL_Q).format(a=a, b=b), "\n".join(lines),
                steps, f"{a} × {b} = {a * b}.")


# (singular, plural, short name, target singular, target plural, factor, largest amount asked)
UNITS = [
    ("kilometer", "kilometers", "km", "meter", "meters", 1000, 99),
    ("meter", "meters", "m", "centimeter", "centimeters", 100, 99),
    ("centimeter", "centimeters", "cm", "millimeter", "millimeters", 10, 99),
    ("kilogram", "kilograms", "kg", "gram", "grams", 1000, 99),
    ("liter", "liters", "L", "milliliter", "milliliters", 1000, 99),
    ("hour", "hours", "h", "minute", "minutes", 60, 9),
    ("minute", "minutes", "min", "second", "seconds", 60, 9),
    ("week", "weeks", "wk", "day", "days", 7, 9),
]
UNIT_Q = ["Convert {n} {src} to {dst}.", "How many {dst} are in {n} {src}?", "What is {n} {src} in {dst}?",
          "{n} {short} is how many {dst}?", "Express {n} {src} in {dst}.", "how many {dst} is {n} {src}"]


def conversion(rng: random.Random) -> Task:
    one, many, short, t_one, t_many, factor, top = UNITS[rng.randrange(len(UNITS))]
    n = rng.randint(1, top)
    src, dst = (one if n == 1 else many), (t_one if n * factor == 1 else t_many)
    user = pick(rng, UNIT_Q).format(n=n, src=src, dst=t_many, short=short)
    product = n * factor
    if factor == 60:
        head = factor // 10  # multiply by 6, then append the zero: steps a small model can do
        math = f"{n} × {head} = {n * head}, then add a zero: {product}."
    else:
        math = f"{n} × {factor} = {product}."
    thought = f"1 {one} is {factor} {t_many}.\n{math}"
    return Task("units", ("unit", short, n), user, thought, math, f"{n} {src} is {product} {dst}.")


SORT_Q = ["Sort these numbers from smallest to largest: {xs}.", "Put {xs} in ascending order.",
          "Order from lowest to highest: {xs}", "sort ascending: {xs}",
          "Sort these numbers from largest to smallest: {xs}.", "Put {xs} in descending order.",
          "Order from highest to lowest: {xs}", "sort descending: {xs}"]


def sorting(rng: random.Random) -> Task:
    xs = rng.sample(range(1, 10), rng.randint(3, 5))  # single digits: a small model sorts them reliably
    form = rng.randrange(len(SORT_Q))
    descending = form >= 4
    ordered = sorted(xs, reverse=descending)
    word = "largest" if descending else "smallest"
    listed = ", ".join(map(str, xs))
    lines = [f"The numbers are {listed}.", f"The {word} is {ordered[0]}."]
    lines += [f"Then {x}." for x in ordered[1:]]
    order = "descending" if descending else "ascending"
    answer = f"In {order} order: {', '.join(map(str, ordered))}."
    return Task("sort", ("sort", descending, tuple(xs)), SORT_Q[form].format(xs=listed), "\n".join(lines),
                "", answer)

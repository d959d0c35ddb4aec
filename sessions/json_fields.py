"""Typed reads of an untrusted JSON object: each check failing raises a ``SessionFileError`` naming the field.

A check is a type guard (``is_count``: ``TypeGuard[int]``), so what ``Fields.get`` returns has the type
the check proved: nothing read from a file reaches the rest of the code unnarrowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeGuard, TypeVar

from sessions.errors import SessionFileError

MAX_COUNT = 2**31 - 1  # token ids, sizes and counters all fit in 32 bits
_MISSING = object()
T = TypeVar("T")
Check = Callable[[object], TypeGuard[T]]  # True when a value is of the type T (and in its range)


class Fields:
    """One JSON object of a file (``where``), called ``name`` in error messages."""

    def __init__(self, data: object, where: str, name: str = "the header") -> None:
        if not isinstance(data, dict):
            raise SessionFileError(f"{where}: {name} is not a JSON object.")
        self.data: dict[str, object] = data
        self.where, self.name = where, name

    def get(self, key: str, check: Check[T], what: str) -> T:
        """The value of ``key``; ``SessionFileError`` if it is missing or ``check`` refuses it (``what`` it must be)."""
        value = self.data.get(key, _MISSING)
        if value is _MISSING:
            raise SessionFileError(f"{self.where}: {self.name} lacks {key!r}.")
        if not check(value):
            raise SessionFileError(f"{self.where}: {key!r} in {self.name} must be {what}, not {show(value)}.")
        return value

    def get_or(self, key: str, check: Check[T], what: str, default: T) -> T:
        """Like ``get``, but ``default`` when ``key`` is missing."""
        return self.get(key, check, what) if key in self.data else default

    def sub(self, key: str) -> Fields:
        """The object under ``key``; ``SessionFileError`` if it is missing or not an object."""
        return Fields(self.get(key, is_anything, ""), self.where, repr(key))


def is_anything(v: object) -> TypeGuard[object]:
    return True


def is_bool(v: object) -> TypeGuard[bool]:
    return isinstance(v, bool)


def is_text(v: object) -> TypeGuard[str]:
    return isinstance(v, str)


def is_optional_text(v: object) -> TypeGuard[str | None]:
    return v is None or isinstance(v, str)


def is_count(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT


def is_optional_count(v: object) -> TypeGuard[int | None]:
    return v is None or is_count(v)


def is_positive(v: object) -> TypeGuard[int]:
    return is_count(v) and v > 0


def is_number(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_time(v: object) -> TypeGuard[float]:
    return is_number(v) and v >= 0


def is_list(v: object) -> TypeGuard[list[object]]:
    return isinstance(v, list)


def is_count_list(v: object) -> TypeGuard[list[int]]:
    return isinstance(v, list) and all(is_count(t) for t in v)


def is_text_list(v: object) -> TypeGuard[list[str]]:
    return isinstance(v, list) and all(isinstance(s, str) for s in v)


def one_of(options: tuple[str, ...]) -> Check[str]:
    """The check that a value is one of ``options``."""
    def check(v: object) -> TypeGuard[str]:
        return v in options
    return check


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

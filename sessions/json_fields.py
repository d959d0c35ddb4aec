"""Typed access to an untrusted JSON object: each check failing raises a ``SessionFileError`` naming the field."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sessions.errors import SessionFileError

MAX_COUNT = 2**31 - 1  # token ids, sizes and counters all fit in 32 bits
_MISSING = object()


class Fields:
    """One JSON object of a file (``where``), called ``name`` in error messages."""

    def __init__(self, data: Any, where: str, name: str = "the header") -> None:
        if not isinstance(data, dict):
            raise SessionFileError(f"{where}: {name} is not a JSON object.")
        self.data, self.where, self.name = data, where, name

    def get(self, key: str, check: Callable[[Any], bool], what: str) -> Any:
        """The value of ``key``; ``SessionFileError`` if it is missing or ``check`` refuses it (``what`` it must be)."""
        value = self.data.get(key, _MISSING)
        if value is _MISSING:
            raise SessionFileError(f"{self.where}: {self.name} lacks {key!r}.")
        if not check(value):
            raise SessionFileError(f"{self.where}: {key!r} in {self.name} must be {what}, not {show(value)}.")
        return value

    def sub(self, key: str) -> Fields:
        """The object under ``key``; ``SessionFileError`` if it is missing or not an object."""
        return Fields(self.get(key, lambda v: True, ""), self.where, repr(key))


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_text(v: Any) -> bool:
    return isinstance(v, str)


def is_optional_text(v: Any) -> bool:
    return v is None or isinstance(v, str)


def is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT


def is_positive(v: Any) -> bool:
    return is_count(v) and v > 0


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_time(v: Any) -> bool:
    return is_number(v) and v >= 0


def is_count_list(v: Any) -> bool:
    return isinstance(v, list) and all(is_count(t) for t in v)


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

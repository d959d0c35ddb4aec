"""Chat messages: what a conversation is made of."""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Message:
    """One message. An assistant's ``content`` keeps its ``<think>...</think>`` block, as generated."""

    role: str  # "system", "user", "assistant" or "tool"
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a message's role must be one of {', '.join(ROLES)}, not {self.role!r}")
        if not isinstance(self.content, str):
            raise ValueError("a message's content must be text")

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}

"""Generation parameters: what the user chooses for one reply."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

SEED_LIMIT = 2**64  # MLX's random keys take an unsigned 64-bit seed

Params = TypeVar("Params", bound="DataclassInstance")


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the model's logits."""

    temperature: float = 0.0  # 0 = greedy (argmax), no randomness at all
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set whose probability reaches p; 1 = off
    min_p: float = 0.0  # drop tokens less likely than min_p x the top token's probability; 0 = off
    repetition_penalty: float = 1.0  # >1 discourages tokens seen in the last `repetition_context`
    repetition_context: int = 64  # how many recent tokens the penalty looks at
    seed: int | None = None  # fixes the random draws; None = a fresh seed per reply

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be 0 (greedy) or positive, not {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or a positive count, not {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), not {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be positive, not {self.repetition_penalty}")
        if self.repetition_context < 0:
            raise ValueError(f"repetition_context must be >= 0, not {self.repetition_context}")
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be a whole number from 0 to 2**64 - 1, not {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class GenerationParams(SamplingParams):
    """Sampling plus when to stop and how to prefill."""

    max_tokens: int | None = None  # the reply ends after this many tokens; None = when the context is full
    stop: tuple[str, ...] = field(default=())  # the reply ends when its text contains one of these
    prefill_chunk: int | None = None  # prompt tokens per forward pass while prefilling; None: the device profile's
    ignore_eos: bool = False  # an end-of-sequence token does not end the reply (vLLM's; for benchmarks, load tests)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {self.max_tokens}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, not {self.prefill_chunk}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")

    def replaced(self, changes: Mapping[str, object]) -> GenerationParams:
        """These parameters with the fields ``changes`` names set, as a form, a command line or a request
        gives them by name: an unknown name is a TypeError, a value out of range a ValueError."""
        return _replaced(self, changes)


def _replaced(params: Params, changes: Mapping[str, object]) -> Params:
    return dataclasses.replace(params, **changes)  # each value checked by the dataclass's __post_init__

"""What ``Engine.generate`` yields: one event per token, then a final event with the stats."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenEvent:
    """One emitted token. When it is yielded, the caches already hold it."""

    token: int  # token id
    text: str  # the text this token completes (may be "" while a multi-byte character is pending)
    logprob: float  # the target model's log-probability of this token (temperature 1, no masks)
    from_draft: bool = False  # proposed by the draft model and accepted by the target
    finish_reason: str | None = None  # set on the last token: "eos", "length" or "stop"
    top_logprobs: tuple[tuple[int, float], ...] = ()  # (token id, log-probability), likeliest first, if asked


@dataclass(frozen=True)
class GenerationStats:
    """Figures for one call of ``Engine.generate``."""

    prompt_tokens: int = 0  # tokens in the prompt
    reused_tokens: int = 0  # prompt tokens the cache already held (not computed again)
    disk_reused_tokens: int = 0  # of those, the ones read back from the KV disk tier (the rest were in memory)
    prefill_tokens: int = 0  # prompt tokens computed in this call
    prefill_seconds: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0  # from the first emitted token to the last
    draft_proposed: int = 0
    draft_accepted: int = 0
    target_passes: int = 0  # forward passes of the target while decoding
    draft_lengths: tuple[int, ...] = field(default=())  # k chosen for each speculative round
    drafter: str = ""  # what proposed the drafts: the draft model's name, "lookup" or "block" ("": none)
    peak_memory_bytes: int = 0
    kv_bytes: int = 0  # paged: KV memory in use at the end (both models' slabs)
    kv_budget_bytes: int = 0  # paged: the KV memory budget (--max-kv as a size, else the machine's)
    finish_reason: str = ""
    world_size: int = 1  # ranks the target runs on (mlxcore.distributed)
    rank_weight_bytes: tuple[int, ...] = field(default=())  # each rank's share of the target's weights

    @property
    def prefill_tps(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first one (the first one's time is prefill)."""
        steps = self.generated_tokens - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds > 0 else 0.0

    @property
    def acceptance(self) -> float:
        return self.draft_accepted / self.draft_proposed if self.draft_proposed else 0.0


@dataclass(frozen=True)
class FinalEvent:
    """The last item ``Engine.generate`` yields."""

    finish_reason: str  # "eos", "length", "stop"; from the batching scheduler also "cancelled"
    text: str  # the whole reply's text
    stats: GenerationStats


Event = TokenEvent | FinalEvent

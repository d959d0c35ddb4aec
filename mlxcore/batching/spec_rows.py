"""Speculative decoding as rows: the rounds of every drafting reply of a step, in the step's one pass.

The drafter proposes for every drafting reply at once (``drafters.py``); each reply's [y, d_1..d_k] are
k + 1 rows of the step's one target pass, each keeping its logits; then rejection sampling for each reply
(``SpeculativeDecoder.verdict``), its target rewound by k - n (docs/engine.md; docs/drafting.md, "The
interface"). A reply with no proposal (prompt lookup finds none) decodes as a plain row.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.batching.drafters import Drafter, Taken
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.batching.sequence import Sequence
from mlxcore.compiled_forward import CompiledForward
from mlxcore.decode_speculative import Emitted, SpeculativeDecoder, rewind
from mlxcore.kv.base import ModelCache


class BatchRound:
    """One step's rounds: the drafting replies' proposals, then (after the step's pass) their verdicts."""

    def __init__(self, target: CompiledForward, drafter: Drafter, seqs: list[Sequence], k: int) -> None:
        """Propose up to ``k`` tokens for each of ``seqs`` (queued lazily) and announce the verifying rows
        (``PoolExhaustedError`` if a pool cannot take them). ``drafting``: those with a proposal."""
        proposals = drafter.propose(seqs, [_decoder(seq) for seq in seqs], k)
        self.k, self.drafter = k, drafter
        self.draft_seconds: float | None = None  # what the draft passes took, when the runner timed them
        self.drafting = [seq for seq, proposal in zip(seqs, proposals) if proposal is not None]
        self.proposed = [proposal[0].size for proposal in proposals if proposal is not None]  # the drafter's
        # ... and after a constrained draft's, the tokens its grammar forces, checked in the same rows
        self.proposals = [_decoder(seq).with_forced(*proposal) for seq, proposal in zip(seqs, proposals)
                          if proposal is not None]
        self.verify = [PromptFeed(target, tcache, mx.concatenate([mx.array(seq.ids[tcache.offset:]), drafted]),
                                  decoding=True, keep=drafter.keeps)
                       for seq, (drafted, _), tcache in zip(self.drafting, self.proposals, map(_target, self.drafting))]

    def verdicts(self, target: CompiledForward) -> list[tuple[int, int, list[Emitted]]]:
        """After the step's pass: each reply's drafted and accepted counts (of the drafter's tokens) and emitted
        tokens, its caches rewound to hold every token but the last it emits."""
        for feed in self.verify:
            feed.ran()
        sizes = [drafted.size + 1 for drafted, _ in self.proposals]
        rows = target.logits(mx.concatenate([feed.h[-size:] for feed, size in zip(self.verify, sizes)]))[:, 0]
        mx.async_eval(rows)  # (rows, V): each reply's k + 1 in turn
        judged, start = [], 0
        for seq, (drafted, q), size in zip(self.drafting, self.proposals, sizes):
            judged.append(_decoder(seq).judge(rows[start:start + size], drafted, q))
            start += size
        mx.eval(judged)  # every reply's verdict in one evaluation
        out: list[tuple[int, int, list[Emitted]]] = []
        taken: list[Taken] = []
        for seq, feed, (drafted, _), judgement, k in zip(self.drafting, self.verify, self.proposals, judged,
                                                         self.proposed):
            n, emitted = _decoder(seq).verdict(judgement, k)
            rewind(_target(seq), drafted.size - n)
            self.drafter.verified(seq, k, n)
            taken.append((seq, feed.start, len(feed.ids) - drafted.size + n))  # the fed tokens and the n kept
            out.append((k, min(n, k), emitted))
        if any(feed.kept for feed in self.verify):  # the drafter reads the target's hidden states of those
            self.drafter.took(taken, {layer: mx.concatenate([feed.kept[layer][:count] for feed, (_, _, count)
                                                             in zip(self.verify, taken)]) for layer in self.drafter.keeps})
        return out


def _decoder(seq: Sequence) -> SpeculativeDecoder:
    decoder = seq.speculative
    assert decoder is not None  # the runner made it (``BatchRunner._speculative``)
    return decoder


def _target(seq: Sequence) -> ModelCache:
    """A drafting reply's target cache."""
    caches = seq.caches
    assert caches is not None  # (a decoding reply's)
    return caches.target

"""Speculative decoding as rows: the rounds of every drafting reply of a step, in the step's one pass.

A step in which replies draft (the draft-length controller of the step's batch size chose k > 0), after
each drafting reply's pending pick is emitted (a round starts from known tokens):
- the draft proposes k tokens for every drafting reply at once, in k passes of rows (``prompt_feed.py``):
  the first feeds each reply what the draft has not seen (its last emitted tokens), each later one the
  token just drafted; each row attends over its own sequence's blocks (rows rewound every round would
  leave a mirror of the batch stale);
- the target verifies in the step's one pass: each drafting reply's [y, d_1..d_k] are k + 1 rows, beside
  the decode rows of the replies that do not draft and the prompt chunks that join, and every one of
  those k + 1 rows keeps its logits;
- rejection sampling for each reply (``SpeculativeDecoder.verdict``); its target is rewound by k - n, its
  draft by k - 1 - n.
A lone reply drafts the same way, on any cache (a cache of one sequence rides alone in its passes). A model
whose layers are not run split here (a hybrid one) takes ``SpeculativeDecoder.round`` instead. Without a
draft model, prompt lookup proposes (``prompt_lookup.py``): no draft passes, and a reply whose last tokens
occurred nowhere before decodes as a plain row.
"""

from __future__ import annotations

from collections.abc import Sequence as Listed

import mlx.core as mx

from mlxcore.batching.batch_forward import BatchDecoder
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.batching.sequence import Sequence
from mlxcore.compiled_forward import CompiledForward
from mlxcore.decode_speculative import Emitted, SpeculativeDecoder, rewind
from mlxcore.kv.base import ModelCache


class BatchRound:
    """One step's rounds: the drafting replies' proposals, then (after the step's pass) their verdicts."""

    def __init__(self, rounds: SpeculativeRows, seqs: list[Sequence], k: int) -> None:
        """Propose up to ``k`` tokens for each of ``seqs`` (queued lazily) and announce the verifying rows
        (``PoolExhaustedError`` if a pool cannot take them). ``drafting``: those with a proposal (prompt
        lookup finds none where nothing repeats: such a reply decodes as a plain row)."""
        proposals = rounds.propose(seqs, [_decoder(seq) for seq in seqs], k)
        self.k = k
        self.draft_seconds: float | None = None  # what the draft passes took, when the runner timed them
        self.drafting = [seq for seq, proposal in zip(seqs, proposals) if proposal is not None]
        self.proposed = [proposal[0].size for proposal in proposals if proposal is not None]  # the drafter's
        # ... and after a constrained draft's, the tokens its grammar forces, checked in the same rows
        self.proposals = [_decoder(seq).with_forced(*proposal) for seq, proposal in zip(seqs, proposals)
                          if proposal is not None]
        self.verify = [PromptFeed(rounds.target, tcache, mx.concatenate([mx.array(seq.ids[tcache.offset:]), drafted]),
                                  decoding=True)
                       for seq, (drafted, _), (tcache, _) in zip(self.drafting, self.proposals,
                                                                 map(_caches, self.drafting))]

    def verdicts(self, target: CompiledForward) -> list[tuple[int, int, list[Emitted]]]:
        """After the step's pass: each reply's drafted and accepted counts (of the drafter's tokens) and emitted
        tokens, its caches rewound to hold every token but the last it emits."""
        for feed in self.verify:
            feed.ran()
        sizes = [drafted.size + 1 for drafted, _ in self.proposals]
        rows = target.logits(mx.concatenate([feed.h[-size:] for feed, size in zip(self.verify, sizes)]))[:, 0]
        mx.async_eval(rows)  # (rows, V): each reply's k + 1 in turn
        out, start = [], 0
        for seq, (drafted, q), size, k in zip(self.drafting, self.proposals, sizes, self.proposed):
            n, emitted = _decoder(seq).verdict(rows[start:start + size], drafted, q, k)
            start += size
            tcache, dcache = _caches(seq)
            rewind(tcache, drafted.size - n)
            if dcache is not None:  # it fed d_1..d_k-1, none of the forced tokens
                rewind(dcache, max(k - 1 - n, 0))
            out.append((k, min(n, k), emitted))
        return out


class SpeculativeRows:
    """The draft's side of the rounds (see the module docstring); without a draft model, prompt lookup's
    proposals (``SpeculativeDecoder.lookup``)."""

    def __init__(self, target: CompiledForward, draft: CompiledForward | None) -> None:
        self.target, self.draft = target, draft
        self.decoder = BatchDecoder(draft) if draft is not None else None

    def propose(self, seqs: list[Sequence], decoders: Listed[SpeculativeDecoder], k: int
                ) -> list[tuple[mx.array, mx.array | None] | None]:
        """Up to k draft tokens (k,) for each of ``seqs``, and the distributions they were drawn from (None for
        greedy), or None where there is no proposal; every pass queued lazily."""
        if self.draft is None:
            return [decoder.lookup(seq.ids, k) for seq, decoder in zip(seqs, decoders)]
        dcaches = [_draft_cache(seq) for seq in seqs]
        logits = self._pass([(cache, seq.ids[cache.offset:]) for seq, cache in zip(seqs, dcaches)])
        for decoder in decoders:
            decoder.start_proposal()
        tokens = _draw(decoders, logits)
        for _ in range(k - 1):
            tokens = _draw(decoders, self._pass([(cache, tokens[row:row + 1]) for row, cache in enumerate(dcaches)]))
        return [decoder.proposal() for decoder in decoders]

    def _pass(self, rows: list[tuple[ModelCache, list[int] | mx.array]]) -> mx.array:
        """One draft pass feeding each cache its tokens; the logits (B, V) after each one's last."""
        assert self.draft is not None and self.decoder is not None  # (``propose``)
        feeds = [PromptFeed(self.draft, cache, ids, decoding=True) for cache, ids in rows]
        self.decoder([], None, feeds)
        for feed in feeds:
            feed.ran()
        out: mx.array = self.draft.logits(mx.concatenate([feed.h[-1:] for feed in feeds]))[:, -1]
        return out


def _draw(decoders: Listed[SpeculativeDecoder], logits: mx.array) -> mx.array:
    """Each reply's next draft token (B,) from the draft's logits (B, V), computed while the next pass is built."""
    tokens = mx.stack([decoder.propose(logits[row]) for row, decoder in enumerate(decoders)])
    mx.async_eval(tokens)
    return tokens


def _decoder(seq: Sequence) -> SpeculativeDecoder:
    decoder = seq.speculative
    assert decoder is not None  # the runner made it (``BatchRunner._speculative``)
    return decoder


def _draft_cache(seq: Sequence) -> ModelCache:
    draft = _caches(seq)[1]
    assert draft is not None  # a reply that drafts with the draft model keeps its cache (``BatchRunner._drafts``)
    return draft


def _caches(seq: Sequence) -> tuple[ModelCache, ModelCache | None]:
    """A drafting reply's target and draft caches (None for prompt lookup)."""
    caches = seq.caches
    assert caches is not None  # (a decoding reply's)
    return caches.target, caches.draft

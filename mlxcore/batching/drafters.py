"""The drafters behind the one speculative round: what proposes the tokens the target verifies as rows.

Every drafter proposes up to k tokens for each drafting reply of a step at once, and the distributions it
drew them from (None for greedy; one-hot for a certain proposal); the target verifies them as rows of the
step's pass (``spec_rows.py``) and rejection sampling keeps n of them. After the verdict each drafter is told
what the target read (``took``: rows of a prompt chunk or of a verification, whose hidden states at the
layers it ``keeps`` a block drafter reads) and what was kept (``verified``: a draft model rewinds its cache).

- ``ModelDrafter``: a draft model (its own cache, k passes of rows; ``catch_up`` feeds it what it missed);
- ``LookupDrafter``: prompt lookup, the n-grams of the reply's own tokens (``prompt_lookup.py``), no model;
- ``BlockDrafter``: a block drafter in DFlash's layout (``block_drafter.py``), one pass for the whole block,
  conditioned on the target's hidden states (its context, kept with the conversation's caches);
- ``LookupFirst``: prompt lookup beside one of the two others, chosen per reply and round.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence as Listed
from typing import TYPE_CHECKING, Protocol, cast

import mlx.core as mx

from mlxcore.batching.batch_forward import BatchDecoder
from mlxcore.batching.prompt_feed import PromptFeed
from mlxcore.batching.sequence import Sequence
from mlxcore.block_drafter import BlockContext, BlockDraftModel
from mlxcore.compiled_forward import CompiledForward
from mlxcore.configs import LOOKUP
from mlxcore.decode_speculative import Proposal, SpeculativeDecoder, one_hot, rewind
from mlxcore.draft_length import DraftLengthController
from mlxcore.kv.base import ModelCache
from mlxcore.kv.budget import KVBudget
from mlxcore.kv.paged import PagedCache
from mlxcore.prompt_lookup import NgramIndex

if TYPE_CHECKING:
    from mlxcore.engine import Engine

BLOCK = "block"  # what a block drafter's replies name as their drafter
Taken = tuple[Sequence, int, int]  # (a reply, the position of the first token the target read, tokens read)


class Drafter(Protocol):
    name: str  # what a reply's stats name as its drafter
    samples: bool  # it draws its tokens from a distribution (a grammar may constrain them), rather than finds them
    keeps: tuple[int, ...]  # target layers whose outputs it reads, for the rows the target reads
    forward: CompiledForward | None  # a draft model's own forward (a lone round of a model not run split)
    vocab: int  # the tokens it can propose

    def may_draft(self, seq: Sequence) -> bool:
        """Whether ``seq`` can draft with it now."""

    def catch_up(self, seq: Sequence, decoder: SpeculativeDecoder, control: DraftLengthController) -> None:
        """Before a round (not timed with it): take in what the reply read while it did not draft."""

    def propose(self, seqs: list[Sequence], decoders: Listed[SpeculativeDecoder], k: int) -> list[Proposal | None]:
        """Up to k tokens (k,) for each of ``seqs`` and their distributions, or None (no proposal); lazy."""

    def release(self) -> None:
        """Nothing decodes now: what it keeps for a batch goes back to the KV budget."""

    def took(self, taken: list[Taken], kept: Mapping[int, mx.array]) -> None:
        """The target read, for good, ``count`` tokens of each (seq, start, count) at positions start, start + 1,
        ... (a prompt chunk, a verification's fed and kept rows, a step's plain decode rows); ``kept``: the
        outputs (rows, 1, hidden) of the layers it ``keeps`` for all those tokens, in that order (empty: the
        pass kept none)."""

    def verified(self, seq: Sequence, k: int, n: int) -> None:
        """``seq``'s round kept n of the k tokens proposed."""


class ModelDrafter:
    """A draft model: a first pass of rows feeds each reply what the draft has not seen, then k - 1 decode
    steps, for replies side by side the decode rows of the draft's batch on its pool (its mirror, as the
    target's batch: one attention a layer for them all; see ``spec_rows.py``)."""

    samples: bool = True
    keeps: tuple[int, ...] = ()

    def __init__(self, forward: CompiledForward, name: str) -> None:
        self.forward: CompiledForward | None = forward
        self.model, self.name = forward, name or "draft model"
        self.vocab = forward.wrapped.args.vocab_size
        self.decoder = BatchDecoder(forward)

    def may_draft(self, seq: Sequence) -> bool:
        return seq.caches is None or seq.caches.draft is not None  # (its cache given back: it decodes plainly)

    def catch_up(self, seq: Sequence, decoder: SpeculativeDecoder, control: DraftLengthController) -> None:
        decoder.catch_up_draft(_draft_cache(seq), seq.ids, control)  # (its forward: ``decoder.draft``)

    def propose(self, seqs: list[Sequence], decoders: Listed[SpeculativeDecoder], k: int) -> list[Proposal | None]:
        dcaches = [_draft_cache(seq) for seq in seqs]
        logits = self._pass([(cache, seq.ids[cache.offset:]) for seq, cache in zip(seqs, dcaches)])
        for decoder in decoders:
            decoder.start_proposal()
        tokens = _draw(decoders, logits)
        for _ in range(k - 1):
            # replies side by side: decode rows of the draft's batch (their caches are on its pool)
            step = self.decoder(cast("list[PagedCache]", dcaches), tokens) if len(dcaches) > 1 else \
                self._pass([(dcaches[0], tokens)])
            assert step is not None  # (a pass of decode rows)
            tokens = _draw(decoders, step)
        return [decoder.proposal() for decoder in decoders]

    def _pass(self, rows: list[tuple[ModelCache, list[int] | mx.array]]) -> mx.array:
        """One draft pass feeding each cache its tokens; the logits (B, V) after each one's last."""
        feeds = [PromptFeed(self.model, cache, ids, decoding=True) for cache, ids in rows]
        self.decoder([], None, feeds)
        for feed in feeds:
            feed.ran()
        out: mx.array = self.model.logits(mx.concatenate([feed.h[-1:] for feed in feeds]))[:, -1]
        return out

    def took(self, taken: list[Taken], kept: Mapping[int, mx.array]) -> None:
        """Nothing: the draft reads the reply's tokens itself."""

    def release(self) -> None:
        self.decoder.release()

    def verified(self, seq: Sequence, k: int, n: int) -> None:
        rewind(_draft_cache(seq), max(k - 1 - n, 0))  # it fed d_1..d_k-1, none of the forced tokens


class LookupDrafter:
    """Prompt lookup: no passes; a reply whose last tokens occurred nowhere before has no proposal (it decodes
    as a plain row that step). A proposal is certain: q one-hot (accepted with probability p(d))."""

    name: str = LOOKUP
    samples: bool = False
    keeps: tuple[int, ...] = ()
    forward: CompiledForward | None = None

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def may_draft(self, seq: Sequence) -> bool:
        return True

    def catch_up(self, seq: Sequence, decoder: SpeculativeDecoder, control: DraftLengthController) -> None:
        """Nothing: the index takes the reply's new tokens as it looks up."""

    def propose(self, seqs: list[Sequence], decoders: Listed[SpeculativeDecoder], k: int) -> list[Proposal | None]:
        return [self._one(seq.ids, decoder, k) for seq, decoder in zip(seqs, decoders)]

    def _one(self, ids: list[int], decoder: SpeculativeDecoder, k: int) -> Proposal | None:
        if not isinstance(decoder.state, NgramIndex):
            decoder.state = NgramIndex()  # one per reply
        found = decoder.state.propose(ids, k)
        if not found:
            return None
        return mx.array(found), None if decoder.params.greedy else one_hot(found, decoder.vocab, mx.float32)

    def took(self, taken: list[Taken], kept: Mapping[int, mx.array]) -> None:
        """Nothing: it reads token ids only."""

    def release(self) -> None:
        """Nothing: it keeps nothing for a batch."""

    def verified(self, seq: Sequence, k: int, n: int) -> None:
        """Nothing: the index follows the reply's ids (rewound ids are indexed again)."""


class BlockDrafter:
    """A block drafter: one pass of [y, mask x k] for every drafting reply at once, each block attending over
    its reply's context (the target's hidden states, ``BlockContext`` on the reply's caches) and itself."""

    name: str = BLOCK
    samples: bool = True
    forward: CompiledForward | None = None

    def __init__(self, model: BlockDraftModel, target: CompiledForward, budget: KVBudget | None = None) -> None:
        self.model, self.target = model, target
        self.budget = budget  # the engine's KV account, which the replies' contexts take their bytes from
        self.keeps: tuple[int, ...] = model.config.target_layer_ids
        self.vocab = target.wrapped.args.vocab_size
        inner, args = target.model, target.wrapped.args
        self._head = inner.embed_tokens.as_linear if args.tie_word_embeddings else target.wrapped.lm_head

    def may_draft(self, seq: Sequence) -> bool:
        context = seq.caches.context if seq.caches is not None else None
        return context is None or not context.refused  # (refused: the KV budget had no room for it)

    def catch_up(self, seq: Sequence, decoder: SpeculativeDecoder, control: DraftLengthController) -> None:
        """Nothing: the target's plain steps kept their hidden states for it (``DecodeSteps``)."""

    def propose(self, seqs: list[Sequence], decoders: Listed[SpeculativeDecoder], k: int) -> list[Proposal | None]:
        mask = self.model.config.mask_token_id
        contexts = [self._context(seq, len(seq.ids) - 1) for seq in seqs]
        block = mx.array([[seq.ids[-1]] + [mask] * k for seq in seqs])  # (B, k + 1): y at its position, masks
        offsets = mx.array([len(seq.ids) - 1 for seq in seqs], dtype=mx.int32)
        hidden = self.model(self.target.model.embed_tokens(block), offsets, contexts)
        logits = self._head(hidden[:, 1:])  # (B, k, V): the masks' positions
        mx.async_eval(logits)
        out: list[Proposal | None] = []
        for row, decoder in enumerate(decoders):
            decoder.start_proposal()
            for i in range(k):
                decoder.propose(logits[row, i])
            out.append(decoder.proposal())
        return out

    def _context(self, seq: Sequence, position: int) -> BlockContext:
        """The reply's context, holding nothing at or past ``position`` (its caches may have been rewound)."""
        caches = seq.caches
        assert caches is not None  # a decoding reply's
        if caches.context is None:
            caches.context = BlockContext(self.budget)
        caches.context.trim(min(position, caches.target.offset))
        return caches.context

    def took(self, taken: list[Taken], kept: Mapping[int, mx.array]) -> None:
        if not taken or len(kept) < len(self.keeps):
            return
        features = mx.concatenate([kept[i][:, 0] for i in self.keeps], axis=-1)  # (rows, layers x hidden)
        positions = mx.array([at for _, start, count in taken for at in range(start, start + count)], dtype=mx.int32)
        layers = self.model.context(features, positions)  # one pass for every reply's rows: (rows, kv_heads, 1, dim)
        row = 0
        written: list[mx.array] = []  # every buffer written
        for seq, start, count in taken:
            # (1, kv_heads, count, dim): this reply's rows
            own = [(k[row:row + count].swapaxes(0, 2), v[row:row + count].swapaxes(0, 2)) for k, v in layers]
            context = self._context(seq, start)
            context.append(start, own)
            written.extend(part for both in context.buffers for part in both)
            row += count
        mx.async_eval(written)  # now: the pass's rows can then go, and each buffer is written in place

    def verified(self, seq: Sequence, k: int, n: int) -> None:
        """Nothing: only the accepted rows are taken (``took``)."""

    def release(self) -> None:
        """Nothing: a reply's context lives with its caches."""


class LookupFirst:
    """Prompt lookup beside a draft model or a block drafter (``mlxchat``'s default where there is one): a reply
    whose own text continues an earlier n-gram takes lookup's proposal, which costs no pass, while lookup
    gives that reply more tokens a second than the other drafter would (``LookupChoice``); the other
    replies of the round draft with the other drafter. A reply under a grammar drafts with the other drafter
    only (its draft is drawn under the grammar's masks). Where rounds are rows of the batched pass (``alone``),
    a reply the other drafter cannot draft for (its draft cache given back, its context refused by the KV
    budget) still drafts with lookup."""

    def __init__(self, other: Drafter, alone: bool = True) -> None:
        self.other, self.lookup, self.alone = other, LookupDrafter(other.vocab), alone
        self.name = f"{other.name}+{LOOKUP}"
        self.samples, self.keeps, self.forward, self.vocab = other.samples, other.keeps, other.forward, other.vocab
        self.rounds = {LOOKUP: 0, other.name: 0}  # rounds each drafter proposed, over every reply
        self._choices: weakref.WeakKeyDictionary[SpeculativeDecoder, LookupChoice] = weakref.WeakKeyDictionary()
        self.learned = LookupChoice()  # every reply's rounds, the start of a new reply's choice
        self._by_lookup: set[int] = set()  # the replies lookup proposed for, this round (by id)

    def may_draft(self, seq: Sequence) -> bool:
        return self.alone or self.other.may_draft(seq)

    def catch_up(self, seq: Sequence, decoder: SpeculativeDecoder, control: DraftLengthController) -> None:
        if self.other.may_draft(seq):
            self.other.catch_up(seq, decoder, control)

    def propose(self, seqs: list[Sequence], decoders: Listed[SpeculativeDecoder], k: int) -> list[Proposal | None]:
        out: list[Proposal | None] = [None] * len(seqs)
        self._by_lookup = set()
        for row, (seq, decoder) in enumerate(zip(seqs, decoders)):
            if decoder.constraint is None and (found := self.lookup.propose([seq], [decoder], k)[0]) is not None:
                if self.choice(decoder).takes_lookup(k, _pass_free_share(decoder.controller, k)):
                    out[row] = found
                    self._by_lookup.add(id(seq))
        rest = [row for row in range(len(seqs)) if out[row] is None and self.other.may_draft(seqs[row])]
        if rest:
            for row, proposal in zip(rest, self.other.propose([seqs[r] for r in rest], [decoders[r] for r in rest], k)):
                out[row] = proposal
        return out

    def choice(self, decoder: SpeculativeDecoder) -> LookupChoice:
        """The reply's measure of both drafters, made at its first round from what the replies before it
        measured (``learned``): a chat's short replies do not each try lookup afresh."""
        if decoder not in self._choices:
            self._choices[decoder] = self.learned.copy()
        return self._choices[decoder]

    def took(self, taken: list[Taken], kept: Mapping[int, mx.array]) -> None:
        self.other.took(taken, kept)

    def release(self) -> None:
        self.other.release()

    def verified(self, seq: Sequence, k: int, n: int) -> None:
        assert seq.speculative is not None  # a drafting reply's
        choice, lookup = self.choice(seq.speculative), id(seq) in self._by_lookup
        for measure in (choice, self.learned):
            (measure.lookup if lookup else measure.other).add(k, n)
        self.rounds[LOOKUP if lookup else self.other.name] += 1
        if not lookup:
            self.other.verified(seq, k, n)


class LookupChoice:
    """One reply's choice between lookup and the other drafter, by tokens a round per second: a round of k
    takes F + k D seconds with the other drafter's passes and F with lookup's proposal, which costs none
    (``share`` = F / (F + k D), from the draft-length controller's timings), so lookup is taken while the
    tokens it is expected to give (from its acceptance, accepted tokens per proposed one over its recent
    rounds: ``_Acceptance``) are at least ``share`` times the other's. When it fell behind, a match is still
    taken every ``PROBE_EVERY``-th time, so the choice follows the reply's text (an edit pays again once the
    reply starts copying)."""

    PROBE_EVERY = 16

    def __init__(self) -> None:
        self.lookup, self.other = _Acceptance(), _Acceptance()
        self.skipped = 0  # matches not taken since lookup was last tried

    def copy(self) -> LookupChoice:
        made = LookupChoice()
        made.lookup, made.other = self.lookup.copy(), self.other.copy()
        return made

    def takes_lookup(self, k: int = 1, share: float = 1.0) -> bool:
        if self.lookup.expected(k) >= share * self.other.expected(k):
            return True
        self.skipped += 1
        if self.skipped >= self.PROBE_EVERY:
            self.skipped = 0
            return True
        return False


class _Acceptance:
    """Accepted tokens per proposed token over a drafter's recent rounds (each round's weight decays by
    ``DECAY``); 1.0 before any."""

    DECAY = 0.9

    def __init__(self) -> None:
        self.proposed = self.accepted = 0.0

    @property
    def rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 1.0

    def add(self, proposed: int, accepted: int) -> None:
        self.proposed = self.proposed * self.DECAY + proposed
        self.accepted = self.accepted * self.DECAY + min(accepted, proposed)

    def copy(self) -> _Acceptance:
        made = _Acceptance()
        made.proposed, made.accepted = self.proposed, self.accepted
        return made

    def expected(self, k: int) -> float:
        """Tokens a round of k is expected to emit (each drafted token accepted at ``rate``, then one more)."""
        return sum(self.rate ** i for i in range(k + 1))


def _pass_free_share(controller: DraftLengthController, k: int) -> float:
    """F / (F + k D): the part of a drafted round's time that is not the drafter's passes, by the controller's
    timings (1.0 before it has any)."""
    fixed, per_draft = controller.round_fixed or controller.plain_step, controller.per_draft
    if not fixed or per_draft is None:
        return 1.0
    return fixed / (fixed + k * per_draft)


def drafter_of(engine: Engine) -> Drafter | None:
    """The engine's drafter: its draft model or block drafter (with prompt lookup beside it when the engine
    looks up too: ``LookupFirst``), or prompt lookup alone (None: it does not draft)."""
    other: Drafter | None = None
    if engine.draft_forward is not None:
        other = ModelDrafter(engine.draft_forward, engine.draft_name)
    elif engine.block_drafter is not None:
        other = BlockDrafter(engine.block_drafter, engine.target_forward,
                             engine.kv_budget if engine.kv.kind == "paged" else None)
    if other is not None:
        return LookupFirst(other, alone=engine.target_forward.split) if engine.prompt_lookup else other
    if engine.prompt_lookup:
        return LookupDrafter(engine.target_forward.wrapped.args.vocab_size)
    return None


def _draw(decoders: Listed[SpeculativeDecoder], logits: mx.array) -> mx.array:
    """Each reply's next draft token (B,) from the draft's logits (B, V), computed while the next pass is built."""
    tokens = mx.stack([decoder.propose(logits[row]) for row, decoder in enumerate(decoders)])
    mx.async_eval(tokens)
    return tokens


def _draft_cache(seq: Sequence) -> ModelCache:
    caches = seq.caches
    assert caches is not None and caches.draft is not None  # a reply drafting with the draft model keeps its cache
    return caches.draft

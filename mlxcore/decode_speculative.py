"""Draft-model speculative decoding: the draft proposes k tokens, the target checks them in one pass.

The batching runner takes one round a step for a lone reply with a draft, when
the ``DraftLengthController`` asks for k > 0; for k = 0 the reply takes the
runner's plain (pipelined) decode steps, as every batch does. Each round: the
draft feeds the tokens it has not seen and proposes d_1..d_k; the target feeds
[y, d_1..d_k] (y = the last emitted token) and scores k + 1 positions;
rejection sampling keeps d_1..d_n and picks one more token t. The target is
rewound by k - n, the draft by k - 1 - n (when n = k the draft never fed d_k:
it is fed next round). Between steps the target holds every id but the last,
as after a plain step's read; the draft a prefix of that. A cache that cannot be
trimmed (a hybrid model's, ``kv/hybrid.py``) goes back to the mark set before the
round's pass instead, and holds a prefix: the loop feeds it the rest, as it feeds
any cache what it lacks.

Under a grammar the target's k + 1 rows are masked before the acceptance test, and with
``CONSTRAIN_DRAFT`` the draft proposes under the same masks: docs/structured_output.md, "Speculative decoding".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import mlx.core as mx

from mlxcore import decision_clock
from mlxcore.batching.constraints import GRAMMAR, Bitmask, Constraint, Mask
from mlxcore.device_profile import current
from mlxcore.draft_length import DraftLengthController
from mlxcore.compiled_forward import CompiledForward
from mlxcore.kv.base import ModelCache
from mlxcore.kv.hybrid import HybridCache
from mlxcore.params import SamplingParams
from mlxcore.prefill import prefill, hold
from mlxcore.rejection import verify, verify_greedy
from mlxcore.sampling import KeyStream, distribution, draw

if TYPE_CHECKING:  # the drafters build on these rounds
    from mlxcore.batching.drafters import Drafter

# The draft proposes under the grammar's masks too (docs/structured_output.md has the acceptance both ways;
# the grammar_spec_accept bench row turns it off to measure the other way).
CONSTRAIN_DRAFT = True
FORCED = 8  # tokens the grammar forces after a constrained draft's, checked in the same target pass at most

Emitted = tuple[int, float, bool]  # (token, log-probability, drafted)
Proposal = tuple[mx.array, mx.array | None]  # drafted tokens (k,), the distributions they were drawn from (k, V)
Judged = tuple[mx.array, mx.array, mx.array, mx.array]  # n accepted, the next token, the log-probabilities of the
# checked + 1 candidates, the drafted tokens: lazy (``SpeculativeDecoder.judge``)


@dataclass
class SpecCounters:
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0  # target passes of the rounds
    round_tokens: int = 0  # tokens the rounds emitted
    draft_lengths: list[int] = field(default_factory=list)  # k of each of its rounds


class SpeculativeDecoder:
    """One reply's rounds (see the module docstring); its counters and random stream last the reply."""

    def __init__(self, target: CompiledForward, drafter: Drafter, params: SamplingParams,
                 controller: DraftLengthController, constraint: Mask | None = None) -> None:
        """``drafter``: what proposes (``batching/drafters.py``)."""
        self.target, self.draft = target, drafter.forward  # (a draft model's forward, for a lone round)
        self.constraint = constraint  # kept in step with the reply by the runner; each round leaves it so
        self.constrain_draft = CONSTRAIN_DRAFT and constraint is not None and drafter.samples
        self.params, self.controller = params, controller
        self.keys = KeyStream(params.seed)
        self.vocab = min(target.wrapped.args.vocab_size, drafter.vocab)  # a draft's padding rows may differ
        self.counters = SpecCounters()
        self.drafter = drafter.name  # what the reply's stats name
        self.state: object = None  # what the drafter keeps for this reply (prompt lookup's index)
        self._draft_masks: list[mx.array] = []  # (vocab,) bool: the masks the draft proposed under, this round

    def round(self, tcache: ModelCache, dcache: ModelCache, ids: list[int], k: int) -> tuple[list[Emitted], float | None]:
        """One round after ``ids`` (prompt and reply so far), with one synchronisation: every pass is queued
        lazily; its tokens, and what its k draft passes took when the controller asked (the runner times the
        round, as a batch's). Should it fail, both caches are trimmed back to a prefix of ``ids[:-1]`` (the
        target's all of it) before the error goes on."""
        try:
            return self._round(tcache, dcache, ids, k)
        except BaseException:
            hold(tcache, ids[:-1])
            hold(dcache, ids[:-1])
            raise

    def _round(self, tcache: ModelCache, dcache: ModelCache, ids: list[int], k: int) -> tuple[list[Emitted], float | None]:
        assert self.draft is not None, "a round of a model not run split drafts with a draft model"
        self.catch_up_draft(dcache, ids, self.controller)
        start = decision_clock.now()
        drafted, q = self._propose(dcache, ids, k)  # (k,) lazy ids, (k, V) or None
        draft_seconds = None
        if self.controller.draft_timing_due():  # now and then: one more sync, to learn what a draft pass costs
            mx.eval(drafted)
            draft_seconds = decision_clock.now() - start
        drafted, q = self.with_forced(drafted, q)
        checked = drafted.size
        fed = ids[tcache.offset:]
        _mark(tcache)
        tcache.begin(len(fed) + checked)
        inputs = mx.concatenate([mx.array(fed), drafted])[None]
        logits = self.target(inputs, cache=tcache.layers)[0, -(checked + 1):]  # (checked + 1, V)
        n, emitted = self.verdict(self.judge(logits, drafted, q), k)
        rewind(tcache, checked - n)
        rewind(dcache, max(k - 1 - n, 0))  # (it fed d_1..d_k-1, none of the forced tokens)
        return emitted, draft_seconds

    def with_forced(self, drafted: mx.array, q: mx.array | None) -> tuple[mx.array, mx.array | None]:
        """The proposal and the tokens the grammar forces after it (``_forced``), checked in the same pass
        (a constrained draft's; the draft is fed them with its next first pass)."""
        forced = self._forced(drafted) if self.constrain_draft else []
        if not forced:
            return drafted, q
        return (mx.concatenate([drafted, mx.array(forced, dtype=drafted.dtype)]),
                None if q is None else mx.concatenate([q, one_hot(forced, q.shape[-1], q.dtype)]))

    def judge(self, logits: mx.array, drafted: mx.array, q: mx.array | None) -> Judged:
        """Rejection sampling of the target's ``logits`` (checked + 1, V) over the ``drafted`` (checked,) (drawn
        from ``q``), queued lazily for ``verdict``: the replies of a batch's round are judged, then evaluated
        at once."""
        logits = logits[:, : self.vocab]
        if self.constraint is not None:
            logits = self._masked(logits, drafted)
        if q is None:
            n, t = verify_greedy(mx.argmax(logits, axis=-1), drafted)
        else:
            n, t = verify(distribution(logits, self.params), q, drafted, self.keys.next())
        chosen = mx.concatenate([drafted, t[None]])  # (checked + 1,): d_1..d_k, then t
        chosen = mx.where(mx.arange(chosen.size) == n, t, chosen)  # t sits right after the accepted run
        logprobs = mx.take_along_axis(logits, chosen[:, None], axis=-1)[:, 0] - mx.logsumexp(logits, axis=-1)
        return n, t, logprobs, drafted

    def verdict(self, judged: Judged, k: int) -> tuple[int, list[Emitted]]:
        """``judge``'s n accepted, and the n + 1 tokens the round emits (evaluated here, unless the caller did
        for every reply at once); counted. ``k``: the tokens the drafter proposed (the grammar's forced ones
        follow them)."""
        mx.eval(*judged)
        n_array, t, logprobs, drafted = judged
        n = int(n_array)
        proposed = cast("list[int]", drafted.tolist())
        self._count(k, n)
        emitted = proposed[:n] + [int(t)]
        return n, [(token, logprob, i < n) for i, (token, logprob)
                   in enumerate(zip(emitted, cast("list[float]", logprobs[: n + 1].tolist())))]

    def _forced(self, drafted: mx.array) -> list[int]:
        """The tokens the grammar forces after d_1..d_k (llguidance's fast-forward: a key, a separator), at
        most ``FORCED``; the matcher left as it was. A token the masked target would not pick there (another
        tokenization of the same text) is rejected as any draft token is: the reply stays exact."""
        constraint = self.constraint
        if not isinstance(constraint, Constraint):
            return []
        taken = 0
        for token in cast("list[int]", drafted.tolist()):
            if not constraint.advance(token):
                break
            taken += 1
        grammar = taken == drafted.size and constraint.phase == GRAMMAR and constraint.closing_free()
        forced = list(constraint.matcher.compute_ff_tokens())[:FORCED] if grammar else []
        constraint.rollback(taken)
        return forced

    def catch_up_draft(self, dcache: ModelCache, ids: list[int], controller: DraftLengthController) -> None:
        """Feed the draft what it missed during plain steps, before a round; ``controller``, of the step's batch
        size, learns what it cost. The round's time includes it: a prompt read by the draft is a cost only
        drafting pays."""
        missed = ids[dcache.offset:-1]
        assert self.draft is not None, "only a draft model has a cache to catch up"
        if len(missed) > FORCED + 1:  # a whole prompt when it starts: in the device's prefill chunks (a round's
            # forced tokens the draft did not see go with its first pass)
            start = decision_clock.now()
            prefill(self.draft, dcache, missed, current().prefill_chunk)  # evaluated: it synchronises
            controller.observe_catch_up(len(missed), decision_clock.now() - start)

    def _propose(self, dcache: ModelCache, ids: list[int], k: int) -> tuple[mx.array, mx.array | None]:
        """Queue k draft passes (the first also feeds what the draft has not seen), computed asynchronously.

        Under a constrained draft each pass is queued before the token it reads is known, and that token is
        read (to fill the next mask) while the pass runs: the graph's building and the grammar's mask overlap
        the model, as in the free draft. The masks are kept for the target's rows (``_masked``)."""
        fed = ids[dcache.offset:]
        _mark(dcache)
        dcache.begin(len(fed))
        inputs = mx.array(fed)[None]
        self.start_proposal()
        assert self.draft is not None  # (``_round``)
        for i in range(k):
            if i:
                dcache.begin(1)
            token = self.propose(self.draft(inputs, cache=dcache.layers)[0, -1])
            mx.async_eval(token)  # start computing while the next pass is being built
            inputs = token.reshape(1, 1)
        return self.proposal()

    def start_proposal(self) -> None:
        """A round's drafting starts: ``propose`` the k tokens, then take them with ``proposal``."""
        self._tokens: list[mx.array] = []
        self._rows: list[mx.array] = []
        self._matched = 0  # tokens the grammar's matcher advanced over while drafting
        self._draft_masks = []

    def propose(self, logits: mx.array) -> mx.array:
        """The next draft token (lazy) from the draft's logits (V,) after the ones proposed this round: under
        the grammar's mask with ``constrain_draft`` (one read of the previous token), drawn as the reply
        samples."""
        logits = logits[: self.vocab]
        if self.constrain_draft:
            constraint = self.constraint
            assert constraint is not None, "constrain_draft needs a constraint"
            mx.async_eval(logits)  # this pass runs while the previous token is read and the mask filled
            if self._tokens:  # drawn under the mask: the matcher takes it
                self._matched += constraint.advance(int(self._tokens[-1]))
            self._draft_masks.append(_allowed(constraint, self.vocab)[0])  # the target's rows reuse them
            logits = mx.where(self._draft_masks[-1], logits, -mx.inf)
        if self.params.greedy:
            token = mx.argmax(logits)
        else:
            self._rows.append(distribution(logits, self.params))
            token = draw(self._rows[-1], self.keys.next())
        self._tokens.append(token)
        return token

    def proposal(self) -> tuple[mx.array, mx.array | None]:
        """The round's drafted tokens (k,) and the distributions they were drawn from (k, V), None for greedy;
        the matcher is back where the round started."""
        if self._matched and self.constraint is not None:
            self.constraint.rollback(self._matched)
        return mx.stack(self._tokens), (mx.stack(self._rows) if self._rows else None)

    def _masked(self, logits: mx.array, drafted: mx.array) -> mx.array:
        """The target's (k + 1, V) logits under the grammar: row i masked after d_1..d_i (rows after a refused
        draft token keep every token: the run stops before them). Filled while the target's pass runs; a
        constrained draft's masks are rows 0..k-1 already (every drafted token is allowed), so only row k is
        filled then."""
        mx.async_eval(logits)
        proposed, constraint = cast("list[int]", drafted.tolist()), self.constraint
        assert constraint is not None, "masked only under a constraint"
        known = self._draft_masks if self.constrain_draft else []
        mask, taken = Bitmask(len(proposed) + 1 - len(known), constraint.vocab), 0
        for i in range(len(proposed) + 1):
            if i >= len(known):
                constraint.fill(mask.words[i - len(known)])
            if i == len(proposed) or not constraint.advance(proposed[i]):
                break
            taken += 1
        constraint.rollback(taken)
        filled = mx.array(mask.allowed()[:, : self.vocab])
        return mx.where(mx.concatenate([mx.stack(known), filled]) if known else filled, logits, -mx.inf)

    def _count(self, k: int, n: int) -> None:
        c = self.counters
        c.proposed, c.accepted, c.rounds, c.round_tokens = c.proposed + k, c.accepted + min(n, k), c.rounds + 1, \
            c.round_tokens + n + 1


def one_hot(tokens: list[int], vocab: int, dtype: mx.Dtype) -> mx.array:
    """(len(tokens), vocab): each row all its mass on its token (the draft distribution of a forced token)."""
    return (mx.arange(vocab)[None, :] == mx.array(tokens)[:, None]).astype(dtype)


def _allowed(constraint: Mask, vocab: int) -> mx.array:
    """(1, vocab) bool: the constraint's next mask (its first ``vocab`` tokens: a draft's may be fewer)."""
    mask = Bitmask(1, constraint.vocab)
    constraint.fill(mask.words[0])
    return mx.array(mask.allowed()[:, :vocab])


def _mark(cache: ModelCache) -> None:
    """Let a cache that cannot be trimmed (``kv/hybrid.py``) come back to this point."""
    if isinstance(cache, HybridCache):
        cache.mark()


def rewind(cache: ModelCache, n: int) -> None:
    """Take the last ``n`` tokens off ``cache`` (a hybrid one: back to its mark)."""
    if n and isinstance(cache, HybridCache):
        # Back to before the round's pass: the loop feeds it what it lacks, as it does after any rewind.
        cache.rewind_to_mark()
        return
    if n and cache.trim(n) != n:
        raise RuntimeError(f"KV cache rewind by {n} failed")  # trim raises first; belt and braces

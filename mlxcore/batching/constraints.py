"""A reply's grammar matcher, and the next-token masks the decode loop applies before sampling.

One ``Constraint`` per constrained reply (llguidance's ``LLMatcher``, compiled
from the request's ``Grammar`` against the model's tokenizer). The loop keeps it
in step with the reply: ``catch_up`` consumes the tokens generated since, then
``fill`` writes the next token's mask, one bit a token, into a row of a batch's
``Bitmask``; speculative rounds consume draft tokens and ``rollback``.

Thinking stays free: the prompt decides where the grammar starts (``think_phase``; docs/structured_output.md,
"Thinking").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from mlxcore.batching.grammar_close import Closing, closer_ids, shortest_reply
from mlxcore.chat_template import TURN_START, token_id
from mlxcore.grammar import Grammar, short_error
from mlxcore.think_blocks import CLOSE, OPEN
from mlxcore.tool_calls import CALL_OPEN

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLTokenizer
    from mlx_lm.tokenizer_utils import TokenizerWrapper

Bits = np.ndarray[tuple[int], np.dtype[np.int32]]  # a row of ``Bitmask.words``: one bit a token
Allowed = np.ndarray[tuple[int], np.dtype[np.bool_]]  # (vocab,) which tokens a position may take

MAY_THINK, THINKING, GRAMMAR = "may think", "thinking", "grammar"  # THINKING: free until </think>


class GrammarError(RuntimeError):
    """The grammar matcher failed part way through a reply (it ends the reply, with this message)."""


@lru_cache(maxsize=4)
def _llg_tokenizer(tokenizer: TokenizerWrapper, vocab: int, eos: tuple[int, ...]) -> LLTokenizer:
    """llguidance's view of a Hugging Face tokenizer (about a second to build: once per model)."""
    import llguidance.hf

    inner = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper holds the HF one
    # (``inner`` is a Hugging Face tokenizer, which mlx-lm's stubs do not name)
    return llguidance.hf.from_tokenizer(inner, n_vocab=vocab, eos_token=list(eos))  # type: ignore[arg-type]


def compile_matcher(grammar: Grammar, tokenizer: TokenizerWrapper, vocab: int, eos_ids: Collection[int]) -> LLMatcher:
    """``grammar``'s ``LLMatcher`` for ``tokenizer``, its first mask computed; ``ValueError`` (a short message,
    no grammar text or parser state) if llguidance cannot compile it or no reply can match it.
    Compiling drops the GIL (llguidance's note), so a thread can do it beside an event loop."""
    from llguidance import LLMatcher, LLParserLimits

    text = grammar.for_tokenizer(token_id(tokenizer, CALL_OPEN) is not None)
    llg = _llg_tokenizer(tokenizer, vocab, tuple(sorted(eos_ids)))
    matcher = LLMatcher(llg, text, log_level=0, limits=LLParserLimits(verbose_errors=False))
    if not matcher.is_error():
        matcher.compute_bitmask()  # where a schema no value matches fails (a $ref to itself, say)
    if matcher.is_error():
        raise ValueError(f"This {grammar.source} cannot be used for constrained decoding: "
                         f"{short_error(matcher.get_error())}")
    return matcher


class Constraint:
    """One reply's matcher, fed the reply's tokens; its phase says whether the grammar applies yet."""

    def __init__(self, grammar: Grammar, tokenizer: TokenizerWrapper, vocab: int, eos_ids: Collection[int],
                 prompt: Sequence[int], budget: int | None = None) -> None:
        self.grammar, self.vocab, self.eos = grammar, vocab, sorted(eos_ids)
        compiled = grammar.compiled  # (compiled by the caller for this tokenizer: each reply a copy of it)
        self.matcher = compiled.deep_copy() if compiled is not None else compile_matcher(grammar, tokenizer, vocab,
                                                                                         self.eos)
        self.think, self.close = token_id(tokenizer, OPEN), token_id(tokenizer, CLOSE)
        self.phase = think_phase(tokenizer, prompt, self.think, self.close)
        self.failed: GrammarError | None = None  # set by the decode loop; the runner ends the reply with it
        self.history: list[tuple[str, bool]] = []  # per token consumed: the phase before, whether matched
        # ``budget``: the reply's token cap, which the grammar closes before (``grammar_close``)
        text = grammar.for_tokenizer(token_id(tokenizer, CALL_OPEN) is not None)
        self.closing = Closing(budget, closer_ids(tokenizer), self.eos[0], shortest_reply(
            text, tokenizer, self.matcher, budget)) if budget and self.eos else None

    @property
    def count(self) -> int:
        """Reply tokens consumed."""
        return len(self.history)

    def catch_up(self, reply: Sequence[int]) -> None:
        """Consume ``reply[count:]`` (the reply's tokens are ``reply``); ``GrammarError`` if one is refused."""
        for token in reply[self.count:]:
            if not self.advance(token):
                raise GrammarError(f"The reply left its {self.grammar.source}: "
                                   f"{short_error(self.matcher.get_error()) if self.matcher.is_error() else token}")

    def advance(self, token: int) -> bool:
        """Consume one token; False if the grammar refuses it (a draft's guess; nothing changes then)."""
        phase, matched = self.phase, False
        if phase == MAY_THINK and token == self.think:
            self.phase = THINKING
        elif phase == THINKING:
            self.phase = GRAMMAR if token == self.close else THINKING
        elif token in self.eos:  # the end of the reply: allowed where the grammar is complete (not consumed)
            if not self.matcher.is_accepting():
                return False
        elif self.matcher.try_consume_tokens([token]) == 1:
            self.phase, matched = GRAMMAR, True
        else:
            return False
        self.history.append((phase, matched))
        return True

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` tokens consumed."""
        if not n:
            return
        undone = self.history[-n:]
        del self.history[-n:]
        matched = sum(m for _, m in undone)
        if matched and not self.matcher.rollback(matched):
            raise GrammarError(f"The grammar matcher could not roll back {matched} tokens: "
                               f"{short_error(self.matcher.get_error())}")
        self.phase = undone[0][0]
        if self.closing is not None:
            self.closing.rolled_back(self.count)

    def closing_free(self) -> bool:
        """Whether the reply is not being closed before its cap (``grammar_close``): the grammar alone says
        what comes next."""
        return self.closing is None or self.closing.start < 0

    def fill(self, bits: Bits) -> None:
        """Write the next token's mask into ``bits`` (a row of ``Bitmask.words``); all ones while free."""
        if self.phase == THINKING:
            bits[:] = -1
            if self.closing is not None and self.close is not None and self.closing.stop_thinking(self.count):
                bits[:] = 0  # near the token cap: the answer must start now to be complete
                _allow(bits, self.close)
            return
        if self.matcher.is_error():
            raise GrammarError(f"The {self.grammar.source} grammar failed: {short_error(self.matcher.get_error())}")
        forced = self.closing.token(self.count, self.matcher) if self.closing is not None else None
        if forced is not None:  # near the token cap: the way to a complete reply
            bits[:] = 0
            _allow(bits, forced)
            return
        self.matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if self.phase == MAY_THINK and self.think is not None:
            _allow(bits, self.think)
        if not bits.any():  # a stopped matcher allows nothing more: end of text (never an empty row)
            _allow(bits, self.eos[0])


def _allow(bits: Bits, token: int) -> None:
    bits.view(np.uint32)[token // 32] |= np.uint32(1 << token % 32)


def think_phase(tokenizer: TokenizerWrapper, prompt: Sequence[int], think: int | None, close: int | None) -> str:
    """Where the grammar starts, from the prompt's last turn (see the module docstring)."""
    if think is None or close is None:
        return GRAMMAR
    start = token_id(tokenizer, TURN_START)
    turn = max((i for i, t in enumerate(prompt) if t == start), default=-1) if start is not None else -1
    tail = list(prompt[turn + 1:]) if turn >= 0 else list(prompt[-64:])  # the reply's own turn
    opened = max((i for i, t in enumerate(tail) if t == think), default=-1)
    closed = max((i for i, t in enumerate(tail) if t == close), default=-1)
    if opened > closed:
        return THINKING
    header = tokenizer.encode("assistant\n", add_special_tokens=False)
    return MAY_THINK if turn >= 0 and tail == list(header) else GRAMMAR


class Bitmask:
    """One step's masks, a row per reply of the batch (one bit a token, llguidance's layout); unconstrained
    rows stay all ones."""

    def __init__(self, rows: int, vocab: int) -> None:
        self.vocab = vocab
        self.words = np.full((rows, (vocab + 31) // 32), -1, dtype=np.int32)

    def allowed(self) -> np.ndarray[tuple[int, int], np.dtype[np.bool_]]:
        """(rows, vocab) bool: which tokens each row may pick."""
        bits = np.unpackbits(self.words.view(np.uint8), axis=1, bitorder="little")
        return bits[:, : self.vocab].astype(bool)


class PositionMask:
    """A reply's mask that depends only on its position: the tokens ``allowed(i)`` lets position i take
    (None: every token). For replies shaped without a grammar (the bench's and the tests' scripted replies);
    the decode loop treats it as it treats a ``Constraint``."""

    failed: GrammarError | None = None

    def __init__(self, vocab: int) -> None:
        self.vocab, self.count = vocab, 0

    def allowed(self, position: int) -> Allowed | None:
        """(vocab,) bool, or None for no mask; subclasses say."""
        raise NotImplementedError

    def catch_up(self, reply: Sequence[int]) -> None:
        self.count = len(reply)

    def advance(self, token: int) -> bool:
        allowed = self.allowed(self.count)
        if allowed is not None and not allowed[token]:
            return False
        self.count += 1
        return True

    def rollback(self, n: int) -> None:
        self.count -= n

    def fill(self, bits: Bits) -> None:
        allowed = self.allowed(self.count)
        if allowed is None:
            bits[:] = -1
            return
        padded = np.zeros(bits.size * 32, dtype=bool)
        padded[: allowed.size] = allowed
        bits[:] = np.packbits(padded, bitorder="little").view(np.int32)


Mask = Constraint | PositionMask  # what the decode loop applies to a reply's next token

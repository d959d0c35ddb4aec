"""The Engine: one target model (and optionally a draft) that turns prompt ids into token events."""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Generator, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from mlxcore import buffer_cache
from mlxcore.batching.batch_forward import warm_up as warm_up_rows
from mlxcore.block_drafter import BlockDraftModel, block_length
from mlxcore.caches import Caches
from mlxcore.compile_support import compile_works
from mlxcore.compiled_forward import CompiledForward
from mlxcore.configs import KVConfig
from mlxcore.device_profile import current, gpu_memory
from mlxcore.distributed.broadcast import every_rank
from mlxcore.distributed.kv_shards import KVShards
from mlxcore.distributed.world import SINGLE, World
from mlxcore.draft_length import DraftLengthController
from mlxcore.errors import PromptError, UsageError
from mlxcore.events import Event, GenerationStats
from mlxcore.fast_exp import warm_up as warm_up_fast_exp
from mlxcore.grammar import Grammar
from mlxcore.kv.base import CacheMeta, ModelCache, Tensors
from mlxcore.kv.errors import CacheStateError
from mlxcore.kv.budget import KVBudget, format_bytes, machine_kv_bytes, weights_bytes, wire_recommended_limit
from mlxcore.kv.geometry import KVGeometry, activation_dtype, model_geometry
from mlxcore.kv.hybrid import HybridCache, linear_layers
from mlxcore.kv.hybrid_prefixes import HybridPrefixCache
from mlxcore.kv.model_cache import check_hybrid, make_block_pool, make_model_cache
from mlxcore.kv.paged import PagedCache
from mlxcore.kv.paged_pool import BlockPool
from mlxcore.params import GenerationParams
from mlxcore.prefill import Progress
from mlxcore.sampling import warm_up as warm_up_sampling
from mlxcore.sequences import common_prefix_length

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


# Of the KV budget, what a hybrid model's kept caches may hold (its live caches are not counted in it).
PREFIX_SHARE = 0.25


def _linear_state_bytes(model: nn.Module) -> int:
    """Bytes of one sequence's linear-layer states: one token through ``model``."""
    cache = make_model_cache(model, kind="standard")
    assert isinstance(cache, HybridCache)
    cache.begin(1)
    mx.eval(model(mx.array([[0]]), cache=cache.layers))
    return sum(state.nbytes for state in cache.states)


class Engine:
    """Generates token events from prompt ids on caches the caller owns.

    The caller makes caches with ``new_caches`` and passes the same ones back on
    the next call: ``generate`` keeps the longest prefix they already hold and
    computes only the rest. With a draft model, decoding is speculative.
    """

    def __init__(self, model: nn.Module, tokenizer: TokenizerWrapper | None = None, *, kv: KVConfig = KVConfig(),
                 draft_model: nn.Module | None = None, num_draft: int = 8, context_length: int | None = None,
                 fingerprint: str = "", draft_fingerprint: str = "", model_name: str = "",
                 draft_name: str = "", generation_defaults: dict | None = None, world: World = SINGLE,
                 prompt_lookup: bool = False, block_drafter: BlockDraftModel | None = None) -> None:
        if linear_layers(model) or (draft_model is not None and linear_layers(draft_model)):
            check_hybrid(kv.kind, kv.kv_bits)
        self.hybrid = bool(linear_layers(model))  # Qwen3.5, Qwen3-Next: linear layers with a state each
        # Bytes of one sequence's linear states, measured here: on every rank alike (a sharded pass is collective)
        self.linear_state_bytes = _linear_state_bytes(model) if self.hybrid else 0
        self.model = model
        self.tokenizer = tokenizer
        self.draft_model = draft_model
        # Draft tokens found in each reply's own text (``prompt_lookup.py``): alone, or beside a drafter.
        self.prompt_lookup = prompt_lookup
        # Or a block drafter (``block_drafter.py``): a block of drafts a pass, from the target's hidden states.
        self.block_drafter = block_drafter if draft_model is None else None
        # Decode steps and verification run through these (same logits, fewer kernel launches).
        self.target_forward = CompiledForward(model)
        self.draft_forward = CompiledForward(draft_model) if draft_model is not None else None
        self.fingerprint = fingerprint  # identifies the target's weights, config and tokenizer
        self.draft_fingerprint = draft_fingerprint
        self.model_name, self.draft_name = model_name, draft_name  # for display and session files
        self.kv = kv
        self.context_length = context_length or getattr(getattr(model, "args", None), "max_position_embeddings", None)
        self.eos_ids = set(tokenizer.eos_token_ids) if tokenizer is not None else set()
        # Learns across replies; a block drafter's k is at most its block (the device's, the folder's) less y.
        self.draft_control = DraftLengthController(max_k=num_draft if self.block_drafter is None else
                                                   min(num_draft, block_length(self.block_drafter) - 1))
        # The sampling the target's generation_config.json recommends (GenerationParams fields).
        self.generation_defaults = dict(generation_defaults or {})
        self.last_stats: GenerationStats | None = None
        self._pools: dict[str, BlockPool] = {}  # paged block pool per model ("target", "draft")
        self._kv_budget: KVBudget | None = None  # bytes both pools share; made with the first paged cache
        self._prefixes: HybridPrefixCache | None = None  # a hybrid target's ended caches (prefix caching)
        # The ranks the target is split over (mlxcore.distributed); each holds its share of the KV heads.
        self.world = world
        self.kv_shards = KVShards(world)
        self.rank_weight_bytes = tuple(every_rank(world, weights_bytes(model)))  # each rank's share of the target
        wire_recommended_limit()  # Metal: weights and caches stay resident (a no-op on the CPU)
        gpu = gpu_memory()
        buffer_cache.limit(gpu[0] if gpu else None)
        buffer_cache.clear()  # what loading left there (fused_linear.py frees the unfused q/k/v, gate/up weights)

    @property
    def drafts(self) -> bool:
        """Whether replies may decode speculatively: a draft model, a block drafter, or prompt lookup."""
        return self.draft_model is not None or self.block_drafter is not None or self.prompt_lookup

    def warm_up(self) -> None:
        """Compile the decode kernels of both models, the sampler's, and prefill's exp on the CPU, before the
        first reply (see ``batch_forward.warm_up``, ``sampling.warm_up`` and ``fast_exp.warm_up``)."""
        for forward in (self.target_forward, self.draft_forward):
            if forward is not None:
                warm_up_rows(forward)
        if current().fast_exp:
            warm_up_fast_exp()
        if compile_works():  # the sampler's graphs, for logits of the target's size and dtype (no forward pass)
            warm_up_sampling(mx.zeros((1, self.model.args.vocab_size), dtype=activation_dtype(self.model)))

    @property
    def batches(self) -> bool:
        """Whether replies run side by side on this engine's caches: paged ones, or a hybrid model's standard
        ones (``batching/hybrid_batch.py``); on the others one reply runs at a time."""
        return self.kv.kind == "paged" or (self.hybrid and self.kv.kind == "standard")

    @staticmethod
    def prefill_chunk(params: GenerationParams) -> int:
        """Prompt tokens a forward pass while reading a prompt: the request's, else the device profile's."""
        return params.prefill_chunk or current().prefill_chunk

    @property
    def default_params(self) -> GenerationParams:
        """GenerationParams with the model's recommended sampling, mlxchat's defaults for the rest."""
        return GenerationParams(**self.generation_defaults)

    def reply_cap(self, params: GenerationParams, prompt_tokens: int) -> int | None:
        """The most tokens a reply may have: ``min(max_tokens, room left)`` (None: no end).

        The room left is what ``token_limit`` leaves after the prompt, so no reply, asked for
        however many tokens, outgrows the context or the paged pool.
        """
        limit = self.token_limit()
        if limit is None:
            return params.max_tokens
        room = limit if self.kv.kind == "rotating" else max(limit - prompt_tokens, 1)
        return room if params.max_tokens is None else min(params.max_tokens, room)

    def token_limit(self) -> int | None:
        """The most tokens one sequence may hold: the model's context; with the paged cache also what the
        pool (``--max-kv``) and the byte budget hold for it alone, less a draft round's room (its drafted
        tokens sit in both caches before the round rewinds them); with a hybrid model's standard caches, what
        the byte budget holds beside its linear states. A rotating window never fills: its limit is the
        context. None: no limit known."""
        if not self.batches:
            return self.context_length
        room = self.kv_room()[0]
        return room if self.context_length is None else min(self.context_length, room)

    def kv_room(self) -> tuple[int, str]:
        """(tokens the paged pools hold for one sequence, what bounds them, in words for a message); for a hybrid
        model's standard caches, what the byte budget holds beside one set of linear states and its snapshot
        (``batching/byte_account.py``)."""
        if self.kv.kind != "paged":
            room = (self.kv_budget.limit - 2 * self.linear_state_bytes) // self.kv_token_bytes
            return max(room, 1), f"its {format_bytes(self.kv_budget.limit)} budget"
        pools = [self.pool("target")] + ([self.pool("draft")] if self.draft_model is not None else [])
        block = pools[0].block_size
        by_tokens = min(p.config.max_blocks for p in pools) * block
        by_bytes = self.kv_budget.limit // sum(p.block_bytes for p in pools) * block
        spare = self.draft_control.max_k + 1 if self.draft_model is not None else 0
        if by_bytes < by_tokens:
            return max(by_bytes - spare, 1), f"its {format_bytes(self.kv_budget.limit)} budget"
        return max(by_tokens - spare, 1), f"its {by_tokens:,} tokens"

    @cached_property
    def kv_token_bytes(self) -> int:
        """Bytes of one token's keys and values in the target's cache and the draft's."""
        caches = self.new_caches()
        return sum(cache.geometry.token_bytes for cache in (caches.target, caches.draft) if cache is not None)

    @property
    def rewind_room(self) -> int:
        """Tokens a rotating cache must rewind after its window wrapped, for this engine's longest drafts.

        A round rewinds the target by k - n <= k and the draft by less; settling a verify pass stopped
        between layers rewinds the layers it reached by all its 1 + k tokens. A wrapped window can rewind
        ``max_rewind + 1`` tokens right after a write (``Window.max_trim``), so the longest draft covers both.
        """
        return self.draft_control.max_k

    def release_kv(self) -> int:
        """Give back to the KV account every byte this engine's pools (and their batch mirrors) hold, cached
        prefixes too, when the engine is being dropped (the account may be shared with other engines); bytes."""
        if self._kv_budget is None:
            return 0
        own = {id(pool) for pool in self._pools.values()}
        return sum(member.release_free_slabs(cached=True) for member in list(self._kv_budget.pools)
                   if id(member) in own or id(getattr(member, "pool", None)) in own)

    def keep_kv_on_disk(self) -> None:
        """Before the process ends (or a model is dropped): the full blocks of this engine's pools, those kept for
        prefix hits and those a cache (a chat) still holds, go to the disk tier, if there is one; the kept ones
        leave memory; the writes are waited for. Run at the exit of every process whose engine has a tier."""
        if any(pool.disk is not None for pool in self._pools.values()):
            from mlxcore.kv.disk_tier import drain_disk_tiers
            for pool in self._pools.values():
                pool.save_held()
            self.release_kv()
            drain_disk_tiers()

    @property
    def pools(self) -> dict[str, BlockPool]:
        """The paged block pools made so far, by role ("target", "draft"); none before the first paged cache."""
        return dict(self._pools)

    @property
    def kv_budget(self) -> KVBudget:
        """The KV memory the paged pools of target and draft share: ``max_kv_bytes``, else the machine's."""
        if self._kv_budget is None:
            limit = self.kv.max_kv_bytes or machine_kv_bytes(
                self.rank_weight_bytes[self.world.rank] + (weights_bytes(self.draft_model) if self.draft_model else 0))
            # Ranks must admit, grow and refuse alike: each keeps the smallest machine's budget.
            self._kv_budget = KVBudget(min(every_rank(self.world, limit)))
        return self._kv_budget

    @property
    def more_kv_advice(self) -> str:
        """How to get more KV room that does not make things worse: a larger max_kv only where one was given;
        where the machine's memory set the budget, a larger one would push the Mac into swap."""
        if self.kv.max_kv_bytes or self.kv.max_kv:
            return "give a larger max_kv"
        return "use 8-bit KV (kv_bits=8) or a smaller model: this machine's memory holds no more"

    @property
    def prefixes(self) -> HybridPrefixCache | None:
        """A hybrid target's kept caches, for prompts that start as theirs did (``hybrid_prefixes.py``): a
        share of the KV budget. None for another model, or a rotating window (it forgets its start)."""
        if self._prefixes is None and self.hybrid and self.kv.kind == "standard":
            self._prefixes = HybridPrefixCache(int(self.kv_budget.limit * PREFIX_SHARE))
        return self._prefixes

    def _new_model_cache(self, model: nn.Module, role: str) -> ModelCache:
        budget = self.kv_budget if self.kv.kind == "paged" else None
        cache = make_model_cache(model, kind=self.kv.kind, block_size=self.kv.block_size, max_kv=self.kv.max_kv,
                                 max_rewind=self.rewind_room, pool=self._pools.get(role), budget=budget,
                                 kv_bits=self.kv.kv_bits, prefixes=self.prefixes if role == "target" else None)
        if isinstance(cache, PagedCache):
            self._keep_pool(role, cache.pool)
        return cache

    def _keep_pool(self, role: str, pool: BlockPool) -> None:
        """``pool`` is the ``role`` model's; with a disk tier configured, the tier goes under it."""
        self._pools[role] = pool
        if pool.disk is None and self.kv.disk_kv_bytes and self.kv.disk_kv_dir and not self.world.distributed:
            fingerprint = self.fingerprint if role == "target" else self.draft_fingerprint
            if fingerprint:  # no fingerprint, no key that tells this model's blocks from another's
                from mlxcore.kv.disk_tier import open_disk_tier
                from mlxcore.kv.pool_disk import PoolDisk
                pool.attach_disk(PoolDisk(open_disk_tier(Path(self.kv.disk_kv_dir), self.kv.disk_kv_bytes), pool,
                                          fingerprint, role))
                _AT_EXIT.add(self)

    def restore_cache(self, role: str, tensors: Tensors, meta: CacheMeta) -> ModelCache:
        """Rebuild the ``role`` ("target" or "draft") cache saved by ``cache_state``, in this engine's pool.

        A rotating window saved with less rewind room than ``rewind_room`` is refused
        (``CacheStateError``): its rounds would fail once it wraps.
        """
        if meta.get("kind") == "rotating" and int(meta.get("max_rewind", 0)) < self.rewind_room:
            raise CacheStateError(f"The saved rotating KV cache rewinds {meta.get('max_rewind')} tokens; "
                                  f"drafts of {self.draft_control.max_k} need {self.rewind_room}.")
        model = self._model(role)
        tensors = self.kv_shards.own_tensors(role, tensors)  # saved whole: every rank's heads
        if meta.get("kind") == "paged":  # the first paged cache: a pool in the budget, of its block size
            self.pool(role, int(meta.get("block_size", 16)))
        cache = ModelCache.from_state(model, tensors, meta, pool=self._pools.get(role))
        if isinstance(cache, PagedCache):
            self._keep_pool(role, cache.pool)
        if isinstance(cache, HybridCache) and role == "target":  # kept when released, as a new one would be
            cache.prefixes = self.prefixes
        return cache

    def cache_state(self, role: str, cache: ModelCache, ids: Sequence[int]) -> tuple[KVGeometry, Tensors, CacheMeta]:
        """What a session file keeps of the ``role`` cache, which holds the first of ``ids``: (geometry, tensors,
        metadata), whole over the ranks (over several ranks every rank calls this, in the same order: it
        gathers their heads)."""
        tensors, meta = cache.state_dict(ids)
        whole = self.kv_shards.whole_tensors(role, tensors)
        if "linear" in meta and whole is not tensors:  # the linear states' shapes as the whole model's
            shapes = {key: (dtype, list(whole[f"linear.0.{key}"].shape)) for key, (dtype, _) in
                      meta["linear"]["shapes"].items()}
            meta = {**meta, "linear": {**meta["linear"], "shapes": shapes}}
        return self.kv_shards.whole_geometry(role, cache.geometry), whole, meta

    def whole_geometry(self, role: str) -> KVGeometry:
        """The ``role`` model's KV geometry as a session file records it (every rank's heads)."""
        return self.kv_shards.whole_geometry(role, model_geometry(self._model(role)))

    def pool(self, role: str, block_size: int | None = None) -> BlockPool:
        """The paged block pool of ``role`` ("target" or "draft"), made (empty, in the budget; blocks of
        ``block_size``, else the configured size) if there is none."""
        if role not in self._pools:
            self._keep_pool(role, make_block_pool(self._model(role), block_size=block_size or self.kv.block_size,
                                                  max_kv=self.kv.max_kv, budget=self.kv_budget, kv_bits=self.kv.kv_bits))
        return self._pools[role]

    def _model(self, role: str) -> nn.Module:
        """The ``role`` ("target" or "draft") model."""
        model = self.model if role == "target" else self.draft_model
        if model is None:
            raise UsageError("This engine has no draft model.")
        return model

    def new_caches(self) -> Caches:
        """Empty caches of the configured kind for the target (and the draft, if any)."""
        draft = self._new_model_cache(self.draft_model, "draft") if self.draft_model is not None else None
        return Caches(self._new_model_cache(self.model, "target"), draft)

    def _check_prompt(self, prompt_ids: Sequence[int]) -> None:
        if len(prompt_ids) == 0:
            raise PromptError("The prompt is empty: type a message first.")
        if self.kv.kind == "rotating":
            return
        limit = self.token_limit()
        if limit is None or len(prompt_ids) < limit:
            return
        if limit == self.context_length:
            raise PromptError(f"The prompt has {len(prompt_ids)} tokens, more than the model's context of "
                              f'{limit}: shorten it, start a new chat, or use a rotating KV cache (kind="rotating").')
        raise PromptError(f"The KV cache memory is full: the prompt's {len(prompt_ids):,} tokens do not fit in "
                          f"{self.kv_room()[1]} (max_kv): start a new chat, or {self.more_kv_advice}.")

    def keep_prefix(self, caches: Caches, prompt_ids: list[int]) -> int:
        """Trim ``caches`` to their longest common prefix with the prompt (at least one token left to
        compute; a draft cache too); the target's tokens kept; ``caches.ids`` the prompt's from then on. As
        ``generate`` does before a turn."""
        prompt_ids = list(prompt_ids)
        kept = self._reuse(caches, "target", prompt_ids)
        if caches.draft is not None:
            self._reuse(caches, "draft", prompt_ids)
        if caches.context is not None:  # a block drafter's rows of the tokens kept, none of those that changed
            caches.context.trim(min(kept, common_prefix_length(caches.ids, prompt_ids)))
            caches.context.refused = False  # a new turn asks the KV budget again
        caches.ids = prompt_ids
        return kept

    def _reuse(self, caches: Caches, role: str, prompt_ids: list[int]) -> int:
        """Trim the ``role`` cache to its longest common prefix with the prompt; return tokens kept.

        Always leaves at least one token to compute. A cache that cannot rewind
        that far (a wrapped rotating window) is replaced by an empty one.
        """
        cache: ModelCache = getattr(caches, role)
        try:
            cache.settle()  # before reading its tokens: an interrupted pass leaves layer 0 ahead
        except CacheStateError:  # ...by more than a wrapped window can rewind
            cache = self._replace_cache(caches, role)
        keep = min(common_prefix_length(cache.held_ids(caches.ids), prompt_ids), len(prompt_ids) - 1)
        if cache.offset - keep > cache.max_trim:
            # A hybrid model's cache goes back to a snapshot within the common prefix, if it has one.
            restored = cache.restore_snapshot(keep) if isinstance(cache, HybridCache) else None
            if restored is None:
                cache = self._replace_cache(caches, role)
            keep = restored or 0
        cache.trim(cache.offset - keep)
        if cache.offset == 0:
            keep = cache.reuse_prefix(prompt_ids)
        if cache.offset != keep:  # prefilling from here would put every later token at a wrong position
            raise CacheStateError(f"The {role} KV cache holds {cache.offset} tokens after keeping {keep} "
                                  "of this prompt; start a new chat.")
        return keep

    def _replace_cache(self, caches: Caches, role: str) -> ModelCache:
        """An empty cache instead of the ``role`` one (the next prefill rebuilds it), keeping what it keeps."""
        old = getattr(caches, role)
        old.release(caches.ids)  # what it held stays for prefix hits (a hybrid model's, whole)
        cache = self._new_model_cache(self._model(role), role)
        cache.keep = old.keep  # a rotating window's system prompt
        setattr(caches, role, cache)
        return cache

    def generate(self, prompt_ids: Sequence[int], caches: Caches, params: GenerationParams = GenerationParams(),
                 progress: Progress | None = None, grammar: Grammar | None = None,
                 use_draft: bool = True) -> Generator[Event, None, None]:
        """Yield a ``TokenEvent`` per emitted token, then one ``FinalEvent`` with the stats.

        One request to the batching loop, on the caller's thread (``batching/one_reply.py``). Stop iterating
        at any point: the caches then hold exactly the prompt plus the tokens yielded so far. ``progress``
        follows the prompt's reading and may stop it (``StopPrefill``). With a draft (``caches.draft``) or
        prompt lookup, decoding is speculative unless ``use_draft`` is False.
        ``grammar``: what the reply must match after any thinking (``mlxcore.grammar``).
        """
        from mlxcore.batching.one_reply import generate  # the loop builds on the engine

        return generate(self, prompt_ids, caches, params, progress, grammar, use_draft)

    def _kv_stats(self) -> dict:
        """A reply's figures that are the engine's: KV memory, and the ranks it runs on."""
        budget = self._kv_budget
        kv = {"kv_bytes": budget.in_use, "kv_budget_bytes": budget.limit} if budget is not None else {}
        return {**kv, "world_size": self.world.size, "rank_weight_bytes": self.rank_weight_bytes}


# Engines with a disk tier: when the process ends, their blocks go to it (a ``ChatSession`` program's chats too).
_AT_EXIT: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _keep_all_on_disk() -> None:
    for engine in list(_AT_EXIT):
        try:
            engine.keep_kv_on_disk()
        except Exception:  # the process ends anyway: what is not written is computed next time
            logging.getLogger("mlxchat.kv").exception("the KV blocks were not kept on disk at exit")
    _AT_EXIT.clear()

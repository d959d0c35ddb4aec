"""Open an Engine from model references, with the default pair when none is given."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from mlxcore.compile_support import report_compile_failure
from mlxcore.configs import LOOKUP, KVConfig, ModelChoice, check_num_draft
from mlxcore.engine import Engine
from mlxcore.hub import Progress
from mlxcore.kv.budget import KVBudget
from mlxcore.kv.hybrid import linear_layers

SLOW_WARM_UP_S = 1.5  # say what is happening when the kernel warm-up takes longer than this
SLOW_WARM_UP_NOTE = ("compiling decode kernels for this machine (first start only, up to a minute; "
                     "MLXCHAT_COMPILE=0 skips it)")


Notice = Callable[[str], None]  # told a line to show the user

@dataclass(frozen=True)
class OpenedEngine:
    engine: Engine  # its model_name and draft_name say what was loaded
    note: str  # a line to show the user (e.g. why the embedded models are used), or ""


def open_engine(choice: ModelChoice | str = ModelChoice(), kv: KVConfig = KVConfig(), progress: Progress | None = None,
                num_draft: int = 8, notice: Notice | None = None, kv_budget: KVBudget | None = None) -> OpenedEngine:
    """Load the chosen target (and draft) and wrap them in an Engine; ``num_draft`` caps the draft length.

    ``choice``: a ModelChoice, or just the target's name (a hub repo, a folder, an embedded
    name); the default is the default pair (the embedded pair offline).
    ``progress(done, total)`` follows a download; ``notice(text)`` is told when the
    kernel warm-up is slow (it is called from a timer thread and must not use MLX).
    ``kv_budget``: an account this engine's pools share with other engines' (serve's loaded models),
    so that together they never hold more than its limit; None: an account of its own."""
    check_num_draft(num_draft)
    if isinstance(choice, str):
        choice = ModelChoice(model=choice)
    from mlxcore.defaults import default_pair
    from mlxcore.distributed.startup import join_ranks
    from mlxcore.distributed.world import current_world
    from mlxcore.block_drafter import is_block_drafter, load_block_drafter
    from mlxcore.compiled_forward import has_split_layers
    from mlxcore.loading import check_draft_compatible, find_model, load_found
    from mlxcore.memory_fit import check_fits, weights_before_download

    note = ""
    target_ref, draft_ref = choice.model, choice.draft
    if target_ref is None:
        target_ref, default_draft, note = default_pair()
        draft_ref = draft_ref or default_draft
    if choice.no_draft:
        draft_ref = None
    lookup = draft_ref == LOOKUP  # prompt lookup drafts from the reply's own text: no draft model
    if lookup:
        draft_ref = None
    lookup_by_default = draft_ref is None and not choice.no_draft  # (on a model whose layers run split)
    world = current_world()  # several ranks when started by mlx.launch
    if not world.distributed:  # (split over ranks, a model may be larger than one machine: that is the point)
        # Before any download: a model that cannot fit this machine is refused in one line with both sizes.
        check_fits([(ref, weights_before_download(ref)) for ref in (target_ref, draft_ref) if ref])
    target_files = find_model(target_ref, progress=progress)
    draft_files = find_model(draft_ref, progress=progress) if draft_ref else None
    join_ranks(world, target_files, draft_files, kv, num_draft)  # same files and options everywhere, or an error
    target = load_found(target_files, world=world)  # this rank's share of it
    # A DFlash folder (detected by its config) is a block drafter on the target's hidden states, not a model.
    block = draft_files is not None and is_block_drafter(draft_files.config)
    blocks = load_block_drafter(draft_files.folder, target.model) if draft_files and block else None
    draft = load_found(draft_files) if draft_files and not block else None  # whole on every rank
    if linear_layers(target.model) and kv.kind == "paged" and kv.kv_bits is None:
        # A hybrid model's linear states are not in the paged cache yet: its replies batch on standard caches.
        kv = replace(kv, kind="standard")
        note = " ".join(filter(None, [note, f"{target.name} is a hybrid model (Qwen3.5): it answers on the standard "
                                            "KV cache, without prefix sharing between chats, for now."]))
    if draft is not None:
        check_draft_compatible(target, draft)
    # Prompt lookup: alone where asked or where no drafter was named, beside a drafter (``LookupFirst``)
    # otherwise; it runs as rows of the batched pass, so not on a model run whole (a hybrid one).
    lookup = lookup or lookup_by_default and has_split_layers(target.model)
    engine = Engine(target.model, target.tokenizer, kv=kv, draft_model=draft.model if draft else None,
                    num_draft=num_draft, block_drafter=blocks,
                    fingerprint=target.fingerprint, draft_fingerprint=draft.fingerprint if draft else "",
                    model_name=target.name, draft_name=draft_files.name if draft_files else LOOKUP if lookup else "",
                    generation_defaults=target.generation_defaults, world=world,
                    prompt_lookup=lookup or draft_files is not None)  # beside a drafter too (``LookupFirst``)
    if kv_budget is not None:
        engine._kv_budget = kv_budget  # before any pool is made: every pool takes from the shared account
    elif world.distributed and kv.kind == "paged":
        _ = engine.kv_budget  # agreed now, on every rank (a collective): rank 0 alone reads it later (/v1/models)
    warm_up(engine, notice)
    return OpenedEngine(engine, note)


def warm_up(engine: Engine, notice: Notice | None = None,
            timer_class: type[threading.Timer] = threading.Timer) -> None:
    """Compile the engine's decode kernels, telling ``notice`` if that takes a while.
    ``timer_class(seconds, function, args=...)`` makes the countdown (a test passes one it can watch)."""
    if notice is not None:
        report_compile_failure(notice)  # once per process: decoding runs, only slower
    timer = timer_class(SLOW_WARM_UP_S, notice, args=(SLOW_WARM_UP_NOTE,)) if notice else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        engine.warm_up()
    finally:
        if timer is not None:
            timer.cancel()

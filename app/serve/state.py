"""What the routes share: the model registry, settings, metrics; and what the HTTP side knows of a model.

The HTTP side never holds an Engine: only plain facts taken from it when it loads
(its name, tokenizer, default sampling, context length), and its worker, whose
``call`` runs anything that needs the Engine on the engine thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.serve.metrics import ServerMetrics
from app.serve.settings import ServeSettings
from mlxcore import GenerationParams

if TYPE_CHECKING:
    from app.serve.registry import ModelRegistry


@dataclass(frozen=True)
class ModelInfo:
    """The served model, as ``/v1/models`` lists it and requests name it."""

    id: str  # the name clients send as "model" (an embedded name, a repo id or a folder's name)
    tokenizer: object  # the model's Hugging Face tokenizer (no MLX)
    default_params: GenerationParams  # the model's recommended sampling (generation_config.json)
    vocab_size: int
    context_length: int | None  # the most tokens a request may hold: the model's, or fewer when the KV memory holds less
    trained_context: int | None = None  # the model's own context (its config's max_position_embeddings)
    draft: str | None = None  # the draft model's name, when decoding speculatively
    created: int = field(default_factory=lambda: int(time.time()))
    rank_weight_bytes: tuple[int, ...] = ()  # each rank's share of the target's weights (one entry per rank)
    eos_ids: tuple[int, ...] = ()  # the tokens that end a reply (a grammar lets them end it where it is complete)

    @classmethod
    def of(cls, engine, model_id: str, draft_id: str | None) -> ModelInfo:
        """Read from an Engine (on any thread: plain attributes only)."""
        return cls(id=model_id, tokenizer=engine.tokenizer, default_params=engine.default_params,
                   vocab_size=int(engine.model.args.vocab_size), context_length=engine.token_limit(),
                   trained_context=engine.context_length,
                   draft=draft_id, rank_weight_bytes=engine.rank_weight_bytes,
                   eos_ids=tuple(sorted(engine.eos_ids or getattr(engine.tokenizer, "eos_token_ids", ()))))


class ServerState:
    """The routes' view of the running server (``app.state.serve``)."""

    def __init__(self, models: ModelRegistry, settings: ServeSettings = ServeSettings(),
                 rank_weight_bytes: tuple[int, ...] = ()) -> None:
        self.models = models
        self.settings = settings
        self.metrics = ServerMetrics(models, rank_weight_bytes)
        self.stopping = threading.Event()  # set on SIGTERM: replies still running are cut after a grace period

    @property
    def started(self) -> str:
        """The model the server started with: saved sessions use it."""
        return self.models.catalog.started.id

    def close(self) -> None:
        """Before the workers close: let go of held sessions (each on its engine thread) and tokenizer threads."""
        for served in self.models.loaded():
            if served.worker.alive and served.sessions.opened:
                served.worker.call(lambda _, jobs=served.sessions: jobs.close(), timeout=30)
            served.tokens.close()

"""What the routes share: the worker, what the HTTP side knows of the model, settings, metrics.

The HTTP side never holds the Engine: only plain facts taken from it at start
(its name, tokenizer, default sampling, context length), and the worker, whose
``call`` runs anything that needs the Engine on its thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from app.serve.errors import APIError
from app.serve.metrics import ServerMetrics
from app.serve.session_jobs import SessionJobs
from app.serve.settings import ServeSettings
from app.serve.tokenizing import Tokenizing
from mlxcore.params import GenerationParams


@dataclass(frozen=True)
class ModelInfo:
    """The served model, as ``/v1/models`` lists it and requests name it."""

    id: str  # the name clients send as "model" (an embedded name, a repo id or a folder's name)
    tokenizer: object  # the model's Hugging Face tokenizer (no MLX)
    default_params: GenerationParams  # the model's recommended sampling (generation_config.json)
    vocab_size: int
    context_length: int | None
    draft: str | None = None  # the draft model's name, when decoding speculatively
    created: int = field(default_factory=lambda: int(time.time()))
    rank_weight_bytes: tuple[int, ...] = ()  # each rank's share of the target's weights (one entry per rank)

    @classmethod
    def of(cls, engine, model_id: str, draft_id: str | None) -> ModelInfo:
        """Read from an Engine (on any thread: plain attributes only)."""
        return cls(id=model_id, tokenizer=engine.tokenizer, default_params=engine.default_params,
                   vocab_size=int(engine.model.args.vocab_size), context_length=engine.context_length,
                   draft=draft_id, rank_weight_bytes=engine.rank_weight_bytes)


class ServerState:
    """The routes' view of the running server (``app.state.serve``)."""

    def __init__(self, worker, model: ModelInfo, settings: ServeSettings = ServeSettings()) -> None:
        self.worker = worker
        self.model = model
        self.settings = settings
        self.tokens = Tokenizing(model.tokenizer)
        self.metrics = ServerMetrics(worker.stats, lambda: worker.alive, model.rank_weight_bytes)
        self.sessions = SessionJobs(settings.sessions_root, settings.pinned_sessions)  # used on the engine thread
        self.stopping = threading.Event()  # set on SIGTERM: replies still running are cut after a grace period

    def check_model(self, name: str) -> None:
        """404 for a model this server does not serve (as OpenAI's API answers)."""
        if name != self.model.id:
            raise APIError(404, f"The model {name!r} does not exist here: this server serves {self.model.id!r} "
                                "(see /v1/models).", param="model", code="model_not_found")

    def close(self) -> None:
        """Before the worker closes: let go of held sessions (on the engine thread) and the tokenizer thread."""
        if self.worker.alive and self.sessions.opened:
            self.worker.call(lambda _: self.sessions.close(), timeout=30)
        self.tokens.close()

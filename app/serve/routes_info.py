"""``GET /v1/models``, ``GET /health`` and ``GET /metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from app.catalog import ModelEntry
from app.serve.registry import ServedModel
from app.serve.state import ServerState

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> dict:
    """OpenAI's model list (``data``). Codex reads the same path as its own catalog (``models``, entries of ~20
    required fields and its system prompt, which change between its releases): an empty one decodes in every
    release, and Codex then uses its fallback metadata for the model named in its config (docs/responses.md)."""
    models = request.app.state.serve.models
    entries = await run_in_threadpool(models.catalog.entries)  # directory listings: off the event loop
    return {"object": "list", "data": [_listed(entry, models.get(entry.id)) for entry in entries], "models": []}


def _listed(entry: ModelEntry, served: ServedModel | None) -> dict:
    """OpenAI's fields, and whether it is loaded; a loaded model's draft and context: what a request may hold
    (the KV memory may hold less than the model was trained for), under the names agents and their libraries
    read it by: ``context_length`` (LM Studio's and OpenRouter's lists), ``max_model_len`` (vLLM's),
    ``loaded_context_length``, with the model's own as ``max_context_length`` (LM Studio's)."""
    listed = {"id": entry.id, "object": "model", "created": served.info.created if served else 0,
              "owned_by": "mlxchat", "source": entry.source, "loaded": served is not None}
    if served is not None:
        fits = served.info.context_length
        listed |= {"context_length": fits, "max_model_len": fits, "loaded_context_length": fits,
                   "max_context_length": served.info.trained_context, "draft": served.info.draft}
    return listed


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 while the engines run, with the models loaded now and those requests wait for; 503, with why, once
    one has died (the process stays up to say so)."""
    models = request.app.state.serve.models
    loaded = models.loaded()
    names = {"models_loaded": [served.entry.id for served in loaded], "models_loading": sorted(models.waiting)}
    for served in loaded:
        if not served.worker.alive:
            return JSONResponse({"status": "error", "error": f"The engine thread has stopped: "
                                 f"{served.worker.failure}"} | names, status_code=503)
    return JSONResponse({"status": "ok"} | names)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.serve
    return Response(state.metrics.text(), media_type=CONTENT_TYPE_LATEST)

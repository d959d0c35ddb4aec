"""``GET /v1/models``, ``GET /health`` and ``GET /metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.serve.state import ServerState

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> dict:
    """OpenAI's model list (``data``). Codex reads the same path as its own catalog (``models``, entries of ~20
    required fields and its system prompt, which change between its releases): an empty one decodes in every
    release, and Codex then uses its fallback metadata for the model named in its config (docs/responses.md)."""
    info = request.app.state.serve.model
    entry = {"id": info.id, "object": "model", "created": info.created, "owned_by": "mlxchat",
             "context_length": info.context_length, "draft": info.draft}
    return {"object": "list", "data": [entry], "models": []}


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 while the engine thread runs; 503, with why, once it has died (the process stays up to say so)."""
    worker = request.app.state.serve.worker
    if worker.alive:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "error", "error": f"The engine thread has stopped: {worker.failure}"},
                        status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.serve
    return Response(state.metrics.text(), media_type=CONTENT_TYPE_LATEST)

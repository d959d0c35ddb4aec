"""The ASGI application: routes, error handlers and the middleware, around one ``ServerState``."""

from __future__ import annotations

from fastapi import FastAPI

from app.serve.errors import install_handlers
from app.serve.middleware import ServeMiddleware
from app.serve.routes_anthropic import router as anthropic_router
from app.serve.routes_generate import router as generate_router
from app.serve.routes_info import router as info_router
from app.serve.routes_responses import router as responses_router
from app.serve.routes_sessions import router as sessions_router
from app.serve.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    """The server's app; ``state`` holds the worker (already started) and what the routes need."""
    app = FastAPI(title="mlxchat serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    for router in (generate_router, anthropic_router, responses_router, info_router, sessions_router):
        app.include_router(router)
    install_handlers(app)
    app.add_middleware(ServeMiddleware, api_key=state.settings.api_key,
                       max_body_bytes=state.settings.max_body_bytes, metrics=state.metrics,
                       body_timeout_s=state.settings.read_timeout)
    return app

"""`mlxchat serve`: an OpenAI- and Anthropic-compatible HTTP server on the continuous-batching scheduler.

The HTTP side (FastAPI on uvicorn's event loop) never touches MLX: it renders
and tokenizes prompts, submits ``Request``s to the named model's ``BatchWorker`` and relays the
events of their handles; everything that needs the Engine runs on the worker's
thread (``worker.call``).

- ``command.py``: the `serve` subcommand: options, the first model, uvicorn.
- ``catalog.py``: the models that load by name (the started one, ``--models-dir``, the hub cache).
- ``registry.py``: the loaded models, leases, LRU and idle expiry: where routes get a request's model.
- ``hosting.py``: the engine thread: each loaded model's worker in turn, loads, evictions, idle unloads.
- ``app.py``: the ASGI app: routes, error handlers, middleware.
- ``state.py``: what the routes share (the registry, model facts, settings, metrics).
- ``schemas.py``: request bodies (pydantic, unknown fields forbidden).
- ``prompts.py``: a request body -> the scheduler's ``Request``.
- ``tokenizing.py``: chat templates and tokenization off the event loop.
- ``templates.py``, ``template_worker.py``: chat templates rendered in a worker process, with a deadline.
- ``grammars.py``: a request's grammar compiled once for its model, off the event loop.
- ``pairing.py``: the pairing rules of calls and results, the same for the three APIs.
- ``running.py``: submitting, merging choices' events, cancelling when the client leaves.
- ``exchange.py``: one request in flight, its metrics and log line.
- ``choices.py``: a choice's text, reasoning, logprobs and usage as events arrive.
- ``replies.py``: OpenAI's response and chunk objects.
- ``streaming.py``: server-sent events.
- ``routes_generate.py``, ``routes_info.py``, ``routes_sessions.py``: the endpoints.
- ``routes_anthropic.py``: Anthropic's Messages API, translated into chat requests at the edge
  (``anthropic_schemas.py``, ``anthropic_translate.py``, ``anthropic_replies.py``, ``anthropic_stream.py``).
- ``session_jobs.py``: session save/restore on the engine thread.
- ``middleware.py``: API key, body limit, one log line per request.
- ``errors.py``: OpenAI-style errors and statuses.
- ``metrics.py``: Prometheus ``/metrics``.
- the bench of the server (its processes, load generator and rows) is in ``bench/serve*.py``.
"""

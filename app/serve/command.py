"""`mlxchat serve`: load the model, run the batching worker, serve the HTTP API with uvicorn.

The main thread (which loaded the models) runs the worker: all MLX work happens
there. Uvicorn's event loop runs on a thread of its own and does the HTTP. If the
engine fails, the process stays up, so that ``/health`` says 503 instead of a
client finding a closed port.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import signal
import sys
import threading
from collections.abc import Callable

from app.options import (MODELS_DIR_ENV, add_generation_options, add_model_options, generation_params, kv_config,
                         model_choice, models_dir)
from app.serve.settings import (MAX_BODY_BYTES, PING_SECONDS, READ_SECONDS, STALL_SECONDS, ServeSettings,
                                duration_seconds)
from mlxcore import UsageError

POLICIES = ("fcfs", "priority", "shortest", "deadline")
SHUTDOWN_GRACE_SECONDS = 3.0  # on SIGTERM, replies in flight may end on their own this long, then are cut
# The rest is imported when the server starts: building the parser (every `mlxchat` command) stays light.


def positive_seconds(text: str) -> float:
    """argparse type: a number of seconds above 0 (argparse turns the ValueError into one line, exit 2)."""
    seconds = float(text)
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return seconds


def idle_seconds(text: str) -> float:
    """argparse type: seconds (300) or a duration ("5m", "1h"), above 0."""
    try:
        seconds = duration_seconds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a duration above 0, not {text}")
    return seconds


def add_serve_parser(commands, epilog: str | None = None) -> None:
    serve = commands.add_parser("serve", help="serve an OpenAI-compatible HTTP API",
                                description="Serve the model over an OpenAI-compatible HTTP API (chat and "
                                            "completions, streaming), with continuous batching.", epilog=epilog)
    group = serve.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this "
                                                           "machine only)")
    group.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    group.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on every request "
                                                        "but /health")
    group.add_argument("--max-body", type=int, default=MAX_BODY_BYTES, metavar="BYTES",
                       help=f"largest request body (default: {MAX_BODY_BYTES:,}; larger is a 413)")
    group.add_argument("--policy", choices=POLICIES, default="fcfs", help="scheduling order (default: fcfs)")
    group.add_argument("--max-running", type=int, default=8, metavar="N",
                       help="requests decoding at once (default: 8)")
    group.add_argument("--max-waiting", type=int, default=64, metavar="N",
                       help="requests queued before new ones get 429 (default: 64)")
    group.add_argument("--step-tokens", type=int, default=None, metavar="N",
                       help="tokens per scheduler step, decode rows and prompt chunks together: larger reads a "
                            "joining prompt sooner, smaller keeps running streams' gaps shorter (default: the "
                            "device's, 512 on a GPU, 256 on the CPU)")
    group.add_argument("--read-timeout", type=positive_seconds, default=READ_SECONDS, metavar="SECONDS",
                       help="a client that takes longer to send a request's line and headers, or pauses this long "
                            f"within its body, is cut (408) (default: {READ_SECONDS:g})")
    group.add_argument("--stall-timeout", type=positive_seconds, default=STALL_SECONDS, metavar="SECONDS",
                       help="a client that stops reading its reply is paused at once (its events are not "
                            "piled up), and cancelled after this long, its memory freed "
                            f"(default: {STALL_SECONDS:g})")
    group.add_argument("--sse-ping-interval", type=positive_seconds, default=PING_SECONDS, metavar="SECONDS",
                       help="a stream sends a keep-alive this often (a comment line; Anthropic's ping event), so "
                            "that a client does not time out while a long prompt is read "
                            f"(default: {PING_SECONDS:g})")
    models = serve.add_argument_group("models by name", "Requests name a model; one not loaded loads (its requests "
                                      "wait). /v1/models lists them, as `mlxchat models` does: the folders under "
                                      "--models-dir and the hub cache (docs/serve.md).")
    models.add_argument("--allow-download", action="store_true",
                        help="a request may name a hub repo that is not cached: it is downloaded (default: local "
                             "files only)")
    models.add_argument("--max-models", type=int, default=1, metavar="N",
                        help="models loaded at once; loading one more unloads the least recently used idle one "
                             "(default: 1). They share the KV memory budget (--max-kv)")
    models.add_argument("--idle-unload", type=idle_seconds, default=None, metavar="SECONDS",
                        help="unload a model (weights and KV memory) after this long without requests; the next "
                             "request loads it again. A request's keep_alive overrides it (default: never)")
    add_model_options(serve)
    add_generation_options(serve)


def _check(args: argparse.Namespace) -> None:
    for name in ("port", "max_body", "max_running", "max_waiting", "step_tokens", "max_models"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.port > 65535:
        raise UsageError(f"--port must be at most 65535, not {args.port}")
    # beyond these, the pool's bookkeeping and the queue only use memory: no machine decodes that many at once
    for name, most in (("max_running", 1024), ("max_waiting", 100_000)):
        if getattr(args, name) > most:
            raise UsageError(f"--{name.replace('_', '-')} must be at most {most:,}, not {getattr(args, name):,}")
    if args.step_tokens is not None and args.step_tokens < args.max_running:  # each running request decodes at least one token a step
        raise UsageError(f"--step-tokens ({args.step_tokens}) must be at least --max-running ({args.max_running}).")
    if args.api_key is not None and not args.api_key.strip():
        raise UsageError("--api-key must not be empty: an empty key would let any 'Authorization: Bearer' in.")
    if args.kv != "paged":
        raise UsageError(f"mlxchat serve batches requests on the paged KV cache, not --kv {args.kv}: leave --kv out.")
    models_dir(args)  # a folder, or UsageError
    generation_params(args)  # bad sampling options fail before the model loads
    kv_config(args)  # and a bad --max-kv or --kv-bits


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _say(text: str) -> None:
    from mlxcore import current_world
    if current_world().leader:  # over several ranks, rank 0 speaks for them
        print(f"mlxchat: {text}", file=sys.stderr, flush=True)


def real_worker(engine, args: argparse.Namespace):
    """One model's worker; the host takes its turns among the other loaded models'. A model whose caches do not
    batch (``Engine.batches``) answers one request at a time."""
    from mlxcore import BatchWorker
    options = _worker_options(args)
    if not engine.batches:
        options["max_running"] = 1
    return BatchWorker(engine, **options)


def ranked_worker(engine, args: argparse.Namespace):
    """Rank 0's worker when the model runs over several ranks (``mlxcore.distributed``)."""
    from mlxcore import RankedWorker
    return RankedWorker(engine, **_worker_options(args))


def _worker_options(args: argparse.Namespace) -> dict:
    return {"policy": args.policy, "max_waiting": args.max_waiting, "max_running": args.max_running,
            "step_tokens": args.step_tokens, "stall_seconds": args.stall_timeout}


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; ``real_worker(engine, args)`` (``ranked_worker`` over several ranks)
    builds each model's scheduler.

    The engines run on this (the main) thread, where the models are loaded (see
    ``mlxcore.batching.worker`` and ``app.serve.hosting``); uvicorn serves from a thread of its own.
    """
    _check(args)  # first: a mistake is told before the model's code loads
    from app.catalog import Catalog, ModelEntry
    from app.serve.registry import ModelRegistry
    from app.serve.state import ServerState

    if not is_loopback(args.host) and not args.api_key:
        _say(f"warning: listening on {args.host} without --api-key: anyone who can reach this port can use "
             "the model. Give --api-key KEY, or serve on 127.0.0.1.")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    settings = ServeSettings(api_key=args.api_key, max_body_bytes=args.max_body, system=args.system,
                             thinking=True if args.think is None else args.think, stall_seconds=args.stall_timeout,
                             read_timeout=args.read_timeout, ping_seconds=args.sse_ping_interval)
    choice = model_choice(args)
    from app.serve.templates import TemplateWorker
    templates = TemplateWorker()  # started first: it gets ready while the model loads
    opened = _open(args, choice, notice=_say)
    world = opened.engine.world
    if world.distributed:
        _check_one_model(args)
        from mlxcore import serve_followers
        if not world.leader:  # rank 0 serves HTTP; this rank takes the same engine steps
            serve_followers(opened.engine, **_worker_options(args))
            return 0
    make_worker = ranked_worker if world.distributed else real_worker
    if opened.note:
        _say(opened.note)
    started = ModelEntry(opened.engine.model_name, choice, "started")
    registry = ModelRegistry(Catalog(started, args.models_dir, args.allow_download), max_models=args.max_models,
                             idle_seconds=args.idle_unload)
    first = _served(started, opened, make_worker, args, settings, templates)
    if world.distributed:
        from app.serve.hosting import SingleHost
        host = SingleHost(registry, first)
    else:
        from app.serve.hosting import ModelHost

        def open_model(entry: ModelEntry, budget):
            templates = TemplateWorker()
            try:
                return _served(entry, _open(args, entry.choice, kv_budget=budget), make_worker, args, settings,
                               templates)
            except BaseException:
                templates.close()
                raise
        host = ModelHost(registry, open_model)
        host.add(first)
    _serve(ServerState(registry, settings, opened.engine.rank_weight_bytes), host, args)
    return 0


def _check_one_model(args: argparse.Namespace) -> None:
    if args.models_dir or args.allow_download or args.max_models != 1 or args.idle_unload:
        raise UsageError("Over several ranks, serve runs the one model it starts with: leave out --models-dir "
                         f"(and unset {MODELS_DIR_ENV}), --allow-download, --max-models and --idle-unload.")


def _open(args: argparse.Namespace, choice, notice=None, kv_budget=None):
    from mlxcore import open_engine
    return open_engine(choice, kv_config(args), num_draft=args.num_draft, notice=notice, kv_budget=kv_budget)


def _served(entry, opened, make_worker: Callable, args: argparse.Namespace, settings: ServeSettings, templates):
    """What the routes hold of a loaded model (built on the engine thread). Its chat template is tried first
    (in ``templates``, a ``TemplateWorker``): one that fails a one-message chat fails the load."""
    from app.serve.registry import ServedModel
    from app.serve.session_jobs import SessionJobs
    from app.serve.state import ModelInfo
    from app.serve.templates import TemplateError
    from app.serve.tokenizing import Tokenizing
    from mlxcore import ModelLoadError

    engine = opened.engine
    tokens = Tokenizing(engine.tokenizer, templates)
    try:
        tokens.templates.probe()
    except TemplateError as error:
        raise ModelLoadError(f"its chat template fails a one-message chat: {error}.") from None
    info = ModelInfo.of(engine, entry.id, engine.draft_name or None)
    info = dataclasses.replace(info, default_params=generation_params(args, info.default_params))
    return ServedModel(entry, make_worker(engine, args), info, tokens,
                       SessionJobs(settings.sessions_root, settings.pinned_sessions))


def _serve(state, host, args: argparse.Namespace) -> None:
    """The HTTP thread serves; this thread runs the engines until the HTTP side stops them."""
    import uvicorn
    from app.serve.app import create_app
    from app.serve.request_head import head_timeout_protocol

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:  # listening now
                served = state.models.get(state.started)
                draft = f" with the draft {served.info.draft}" if served and served.info.draft else ""
                _say(f"serving {state.started}{draft} on http://{args.host}:{args.port}/v1 (ctrl+c stops)")

    config = uvicorn.Config(create_app(state), host=args.host, port=args.port, access_log=False,
                            log_level="warning", timeout_graceful_shutdown=5,
                            http=head_timeout_protocol(args.read_timeout))
    server = Server(config)
    http = threading.Thread(target=_http, args=(server, state, host), name="http")
    _stop_on_signals(server, state, host)
    http.start()
    try:
        host.run()
    except Exception:  # the engine died: keep answering, so that /health says 503 and requests say why
        # (over several ranks a lost rank ends the process where it is noticed: mlxcore.distributed.fail_fast)
        logging.getLogger("mlxchat.serve").exception("the engine thread failed; /health now answers 503")
    http.join()
    if not server.started:
        raise UsageError(f"Cannot listen on {args.host}:{args.port} (see the error above): "
                         "is another server there? Pick another --port.")


def _http(server, state, host) -> None:
    try:
        server.run()  # on a failed start, uvicorn raises SystemExit here: this thread ends, the engine stops
    finally:
        try:
            state.close()  # held sessions go back to the pool (on the engine thread, still running)
        finally:
            host.close()  # whatever happened, the engine thread must return


def _stop_on_signals(server, state, host) -> None:
    """SIGINT or SIGTERM: stop taking requests; replies in flight may end for ``SHUTDOWN_GRACE_SECONDS``,
    then every one is cancelled, so that each stream still ends with a finish reason and ``[DONE]``, and
    each waiting request with an error (``state.stopping``); then the engine stops. A second signal
    stops at once."""
    def stop(signum, frame) -> None:
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True
        if not state.stopping.is_set():
            state.stopping.set()
            cut = threading.Timer(SHUTDOWN_GRACE_SECONDS, host.cancel_all)
            cut.daemon = True  # a server with nothing in flight exits at once, not after the grace period
            cut.start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)

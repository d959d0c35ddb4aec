"""`mlxchat ask PROMPT`: one answer on stdout, optionally continuing a saved session."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from app.options import generation_params, kv_config, model_choice
from mlxcore.errors import PromptError
from mlxcore.events import FinalEvent, TokenEvent
from mlxcore.launch import open_engine
from sessions.chat_session import ChatSession
from sessions.thinking import ThinkingSplitter


def read_prompt(args: argparse.Namespace) -> str:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise PromptError("The prompt is empty: give a question, e.g. mlxchat ask \"What is 12 + 7?\"")
    return prompt


def _say(text: str) -> None:
    """A note for the user on stderr, so that stdout stays the reply alone."""
    print(f"mlxchat: {text}", file=sys.stderr, flush=True)


def open_session(args: argparse.Namespace, engine) -> ChatSession:
    """The session in --session FILE if it exists, else a new one; the options apply to it."""
    path = Path(args.session) if args.session else None
    if path is not None and path.exists():
        session = ChatSession.load(path, engine)
        note = getattr(session, "restore_note", "")
        if note:
            _say(note)
        if args.system is not None:
            session.set_system(args.system)
    else:
        session = ChatSession(engine, system=args.system, use_draft=not args.no_draft)
    session.params = generation_params(args)
    session.enable_thinking = args.think
    return session


def run_ask(args: argparse.Namespace) -> int:
    prompt = read_prompt(args)
    generation_params(args)  # bad options fail before the model loads
    opened = open_engine(model_choice(args), kv_config(args), num_draft=args.num_draft, notice=_say)
    if opened.note:
        _say(opened.note)
    session = open_session(args, opened.engine)
    events = session.stream_events(prompt)
    try:
        (print_json if args.json else print_text)(events, show_thinking=args.show_thinking)
    finally:
        events.close()
        if args.session:
            session.save(args.session)
    return 0


def print_text(events, show_thinking: bool) -> None:
    """The answer to stdout as it streams; the thinking to stderr (dim on a terminal)."""
    splitter = ThinkingSplitter()
    dim, plain = ("\033[2m", "\033[0m") if sys.stderr.isatty() else ("", "")
    for event in events:
        if isinstance(event, TokenEvent):
            thinking, answer = splitter.feed(event.text)
        else:
            thinking, answer = splitter.finish()
        if thinking and show_thinking:
            sys.stderr.write(dim + thinking + plain)
            sys.stderr.flush()
        if answer:
            sys.stdout.write(answer)
            sys.stdout.flush()
    sys.stdout.write("\n")


def print_json(events, show_thinking: bool) -> None:
    """One JSON object per line: each token event, then the final event with its stats."""
    for event in events:
        if isinstance(event, TokenEvent):
            record = {"type": "token", **asdict(event)}
        elif isinstance(event, FinalEvent):
            stats = asdict(event.stats) | {"prefill_tps": event.stats.prefill_tps,
                                           "decode_tps": event.stats.decode_tps}
            record = {"type": "final", "finish_reason": event.finish_reason, "text": event.text, "stats": stats}
        print(json.dumps(record), flush=True)

"""`mlxchat ask PROMPT`: one answer on stdout, optionally continuing a saved session."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from app.options import generation_params, kv_config, model_choice, session_path
from mlxcore import share
from mlxcore import current_world
from mlxcore import FinalEvent, Grammar, json_schema, PromptError, TokenEvent, UsageError
from mlxcore import PoolExhaustedError
from sessions import SessionSaveError
from sessions import SessionLock
from sessions import ThinkingSplitter
from app.flags import in_flags

if TYPE_CHECKING:
    from sessions import ChatSession

POOL_FULL_HINT = ("Start a shorter chat (without --session), keep the cache in 8 bits (--kv-bits 8), close other "
                  "programs or chat windows, or give a larger --max-kv if you set one: without it mlxchat already "
                  "takes what this machine's memory holds.")
ASK_WAIT_S = 600  # how long an ask waits for another ask's turn on the same session file
LONG_PROMPT_TOKENS = 1024  # a prefill this long says so on stderr (it takes a while on a big model)


def read_prompt(args: argparse.Namespace) -> str:
    prompt = _read_stdin() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise PromptError("The prompt is empty: give a question, e.g. mlxchat ask \"What is 12 + 7?\"")
    return prompt


def _read_stdin() -> str:
    """Standard input as UTF-8 text (strictly: the locale's lenient decoding would let other bytes through)."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PromptError(f"The prompt on stdin is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
                          f"{error.start} is not valid UTF-8): convert it first, e.g. with iconv -f latin1 -t utf-8."
                          ) from None


def _say(text: str) -> None:
    """A note for the user on stderr, so that stdout stays the reply alone (over several ranks: rank 0's)."""
    if current_world().leader:
        print(f"mlxchat: {text}", file=sys.stderr, flush=True)


def open_session(args: argparse.Namespace, engine) -> ChatSession:
    """The session in --session FILE if it exists (keeping its settings), else a new one; options given override."""
    from sessions import ChatSession  # (imported once the model is: see run_ask)
    path = Path(args.session) if args.session else None
    if path is not None and share(engine.world, path.exists):  # rank 0's disk holds it
        session = ChatSession.load(path, engine)
        note = getattr(session, "restore_note", "")
        if note:
            _say(in_flags(note))
        if args.system is not None:
            session.set_system(args.system)
    else:
        session = ChatSession(engine, system=args.system, use_draft=not args.no_draft)
    session.params = generation_params(args, session.params)
    if args.think is not None:
        session.enable_thinking = args.think
    return session


def answer_grammar(args: argparse.Namespace) -> Grammar | None:
    """The grammar of ``--json-schema FILE``; a file that is not a schema it can compile is a ``UsageError``."""
    if not getattr(args, "json_schema", None):
        return None
    try:
        return json_schema(Path(args.json_schema).read_text())
    except OSError as error:
        raise UsageError(f"--json-schema: cannot read {args.json_schema}: {error.strerror}.") from None
    except ValueError as error:
        raise UsageError(f"--json-schema {args.json_schema}: {error}") from None


def _answer(args: argparse.Namespace, engine, prompt: str, grammar: Grammar | None = None) -> ChatSession:
    """Open the session, stream the reply, save the session if the turn changed it."""
    from app.ranked_reply import RankedReply  # (imported once the model is: see run_ask)
    # A chat window (or another ask) writing the same file would lose one of the two turns.
    with _session_lock(engine.world, args.session):
        session = open_session(args, engine)
        reply = RankedReply(engine.world)  # over several ranks: a silent rank, rank 0's ctrl+c
        session.prefill_progress = lambda done, total: (reply.on_prefill(done, total), _say_long_prefill(done, total))
        before = list(session.messages)
        events = session.stream_events(prompt, grammar)
        answered = False
        try:
            with reply.running():
                if engine.world.leader:
                    (print_json if args.json else print_text)(reply.events(events), show_thinking=args.show_thinking)
                else:  # the other ranks take the same steps and show nothing
                    for _ in reply.events(events):
                        pass
            answered = True
        finally:
            events.close()  # a reply cut short (ctrl+c) is kept as it stands; one with no token adds nothing
            # Over several ranks a save is a collective: only when every rank got this far.
            kept = answered or not engine.world.distributed
            if args.session and session.messages != before and kept:  # a refused prompt leaves the file as it was
                _save(session, args.session)
    if reply.interrupted:  # every rank stopped at rank 0's ctrl+c, the turn saved: exit as one process would
        raise KeyboardInterrupt
    return session


@contextmanager
def _session_lock(world, session: str | None):
    """The session file's lock, held by rank 0 (its disk has the file); every rank hears if it was refused.

    Another ``ask`` on the same file is waited for (its turn ends soon); a chat window is not."""
    def say_waiting() -> None:
        _say(f"{Path(session).name} is in use by another `mlxchat ask`: waiting for it to finish…")

    with ExitStack() as stack:
        if session:
            share(world, lambda: stack.enter_context(SessionLock.acquire(
                Path(session), mark_open=True, holder="ask", wait_s=ASK_WAIT_S, on_wait=say_waiting)) and None)
        yield


def run_ask(args: argparse.Namespace) -> int:
    prompt = share(current_world(), lambda: read_prompt(args))  # over several ranks, rank 0 reads it
    if args.session:  # a folder, or a missing one, fails before the model loads (rank 0's disk holds it)
        share(current_world(), lambda: session_path(args.session))
    generation_params(args)  # bad options fail before the model loads
    grammar = share(current_world(), lambda: answer_grammar(args))
    choice, kv = model_choice(args), kv_config(args)
    from mlxcore import open_engine  # imported once the input is known good: a mistake is told at once

    opened = open_engine(choice, kv, num_draft=args.num_draft, notice=_say)
    if opened.note:
        _say(opened.note)
    try:
        session = _answer(args, opened.engine, prompt, grammar)
    except PoolExhaustedError as error:  # while opening the session's cache or answering
        raise PoolExhaustedError(f"{error} {POOL_FULL_HINT}") from None
    if not args.session:  # (a session file keeps its chat's KV itself): the blocks to the disk tier, for the next ask
        session.caches.release()
        opened.engine.keep_kv_on_disk()
    if session.cut_in_thinking:
        _say("the reply was cut off while thinking, before its answer: allow more with --max-tokens, "
             "or answer with --no-think.")
    return 0


def _say_long_prefill(done: int, total: int) -> None:
    if done == 0 and total >= LONG_PROMPT_TOKENS:
        _say(f"reading the prompt ({total:,} tokens)…")


def _save(session: ChatSession, path: str) -> None:
    try:
        session.save(path)
    except SessionSaveError as error:
        raise SessionSaveError(f"This turn was not saved to the session. {error}") from None


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

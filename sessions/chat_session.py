"""ChatSession: a conversation with history, cache reuse across turns, regenerate, edit and fork."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mlxcore import (EMPTY, close_open_block, Engine, Event, FinalEvent, GenerationParams, GenerationStats, Grammar,
                     json_schema, PromptError, render_chat, render_chat_text, SystemPromptTooLongError, TokenEvent)
from mlxcore import CacheStateError, PoolExhaustedError
from mlxcore import prompt_ids as held_prompt_ids
from mlxcore import Progress, StopPrefill
from mlxcore import LocalBatch
from sessions.batched_turn import Alternatives, BatchedTurn
from sessions.messages import Message
from sessions.reply import Reply
from sessions.titles import shown_title
from sessions.tool_fit import fitted_results
from sessions.tools import Toolbox, ToolSpec

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    from sessions.file_append import FileMark
    from sessions.session_file import Opened


class ChatSession:
    """A conversation on one Engine.

    Each turn templates the whole conversation; the Engine keeps the longest
    prefix its caches already hold and computes only the rest, so turn 10 does
    not recompute turns 1-9. Stopping a ``stream`` keeps the partial reply.

    A turn the engine refuses (``PromptError``: too long, empty) leaves the
    history as it was before the turn. A turn that ends before its first token
    (stopped during prefill, or an error) adds no assistant message.

    ``tools`` (Python functions or OpenAI function schemas) are offered to the model;
    ``send`` returns the reply with the calls it made, ``run_tools`` runs them (or
    every ``send`` does, with ``auto_tools``) and answers with the results, up to
    ``max_tool_steps`` rounds. Tool turns are kept in the history as the model
    wrote them (its calls in the reply's text, each result a ``tool`` message).
    """

    def __init__(self, engine: Engine, system: str | None = None, params: GenerationParams | None = None,
                 *, enable_thinking: bool = True, use_draft: bool = True, tools: Sequence[ToolSpec] = (),
                 auto_tools: bool = False, max_tool_steps: int = 8) -> None:
        if max_tool_steps < 1:
            raise ValueError(f"max_tool_steps must be at least 1, not {max_tool_steps}")
        self.engine = engine
        self.toolbox = Toolbox(tools)
        self.auto_tools = auto_tools
        self.max_tool_steps = max_tool_steps
        self.params = params or engine.default_params  # the model's recommended sampling
        self.enable_thinking = enable_thinking
        self.use_draft = use_draft and engine.drafts
        self.messages: list[Message] = [Message("system", system)] if system else []
        self.caches = engine.new_caches()
        if not self.use_draft:
            self.caches.draft = None
        self.last_stats: GenerationStats | None = None
        self.title: str | None = None  # shown in session lists; None = made from the first user message
        self.store_id: str | None = None  # the session store's id once saved there (autosave)
        self.created_at: float | None = None  # when first saved (epoch seconds)
        self.restore_note: str | None = None  # after load: what the user should know (e.g. cache rebuilt)
        self.saved_files: dict[str, FileMark] = {}  # real path -> the files read or saved: their next save appends
        # Called as the prompt is prefilled (tokens done, in all); raising StopPrefill ends the turn there.
        self.prefill_progress: Progress | None = None
        self.cut_in_thinking = False  # the last reply ended inside its think block (stored closed)

    # what the conversation holds --------------------------------------------------

    @property
    def history(self) -> list[Message]:
        """The messages so far (system first, when there is one)."""
        return list(self.messages)

    @property
    def system(self) -> str | None:
        return self.messages[0].content if self.messages and self.messages[0].role == "system" else None

    @property
    def tokenizer(self) -> TokenizerWrapper:
        """The engine's tokenizer: a turn needs it (an engine made without one can still save and load)."""
        if self.engine.tokenizer is None:
            raise ValueError("This engine was made without a tokenizer: give Engine the model's tokenizer.")
        return self.engine.tokenizer

    def display_title(self) -> str:
        """The title, or the first user message's first line (shortened), or "New chat"."""
        return shown_title(self.title, ((m.role, m.content) for m in self.messages))

    def set_system(self, text: str | None) -> None:
        """Replace (or remove, with None or "") the system prompt; the history stays."""
        rest = self.messages[1:] if self.system is not None else self.messages
        self.messages = ([Message("system", text)] if text else []) + rest

    def prompt_ids(self) -> list[int]:
        """The token ids of the whole conversation, ready for the assistant's next reply."""
        return self._prompt()[0]

    def _prompt(self) -> tuple[list[int], str]:
        """The prompt's ids, and the text its template put where the reply begins (Qwen3: the empty think
        block when thinking is off), which the reply is stored with: the cache holds it."""
        text = render_chat_text(self.tokenizer, [m.as_dict() for m in self.messages],
                                enable_thinking=self.enable_thinking, tools=self.tool_schemas)
        ids = held_prompt_ids(self.tokenizer, text, self.caches.tokens)
        return ids, EMPTY if text.endswith(EMPTY) else ""

    # turns ------------------------------------------------------------------------

    def send(self, text: str, schema: dict | type | None = None) -> Reply:
        """Add a user message and return the whole reply (with its tool calls); with ``auto_tools``, the reply
        that follows the calls' results.

        ``schema`` (a pydantic model class or a JSON Schema dict): the answer is constrained to JSON that
        validates against it (thinking, if on, stays free); the returned text is that JSON alone, its
        reasoning in ``.reasoning``. ``ValueError`` if the schema cannot be compiled."""
        if schema is not None:
            reply = Reply.parse("".join(self.stream(text, grammar=json_schema(schema))), None)
            return reply.answer_only()
        reply = Reply.parse("".join(self.stream(text)), self.tool_schemas)
        return self.run_tools() if self.auto_tools and reply.tool_calls else reply

    # tools ------------------------------------------------------------------------

    @property
    def tool_schemas(self) -> list[dict] | None:
        """The tools offered to the model (OpenAI function schemas), or None."""
        return self.toolbox.schemas or None

    def set_tools(self, tools: Sequence[ToolSpec]) -> None:
        """Offer these tools from the next turn on (a loaded session gets its functions back this way)."""
        self.toolbox = Toolbox(tools)

    def last_reply(self) -> Reply | None:
        """The last assistant message, read as a reply (reasoning, answer, tool calls); None if there is none."""
        if not self.messages or self.messages[-1].role != "assistant":
            return None
        return Reply.parse(self.messages[-1].content, self.tool_schemas)

    def run_tools(self, max_steps: int | None = None) -> Reply:
        """Run the last reply's tool calls, add their results as ``tool`` messages and let the model go on,
        until it answers without calls or after ``max_steps`` rounds (default ``max_tool_steps``); the last reply.

        A call to a tool with no Python function, or that raises, gets an error as its result."""
        reply = self.last_reply()
        if reply is None:
            raise PromptError("There is no reply whose tool calls could run.")
        for _ in range(self.max_tool_steps if max_steps is None else max_steps):
            if not reply.tool_calls:
                break
            reply = Reply.parse("".join(self.stream_tool_results([self.toolbox.run(call) for call in reply.tool_calls])),
                                self.tool_schemas)
        return reply

    def add_tool_results(self, results: Sequence[str]) -> list[Message]:
        """One ``tool`` message per result after the last reply, which made as many calls, each cut to fit the
        context (``sessions.tool_fit``); the history the turn goes back to if it is refused: with the results,
        so that the history never keeps a call without its result."""
        reply = self.last_reply()
        calls = len(reply.tool_calls) if reply is not None else 0
        if calls == 0 or calls != len(results):
            raise PromptError(f"The last reply made {calls} tool call(s); {len(results)} result(s) came back.")
        before = list(self.messages)

        def prompt_tokens(kept: list[str]) -> int:
            self.messages = before + [Message("tool", result) for result in kept]
            return len(self._prompt()[0])
        fitted = fitted_results(results, self.engine.token_limit(), prompt_tokens,
                                lambda text: list(self.tokenizer.encode(text, add_special_tokens=False)),
                                lambda ids: str(self.tokenizer.decode(ids)))
        self.messages = before + [Message("tool", result) for result in fitted]
        return list(self.messages)

    def stream_tool_results(self, results: Sequence[str]) -> Iterator[str]:
        """Add the results of the last reply's calls (``add_tool_results``) and stream the model's next reply."""
        return self._reply(self.add_tool_results(results))

    def start_tool_results(self, results: Sequence[str], batch: LocalBatch) -> BatchedTurn:
        """``stream_tool_results`` on the batching scheduler."""
        return self._batched(self.add_tool_results(results), batch, 1)

    def stream(self, text: str, grammar: Grammar | None = None) -> Iterator[str]:
        """Add a user message and yield the reply's text as it is generated.

        Stop iterating (``close()``) at any point: the partial reply becomes the
        assistant message and the caches hold exactly its tokens. ``grammar``: what
        the answer must match (``mlxcore.grammar``).
        """
        if not text.strip():
            raise PromptError("The message is empty: type something first.")
        before = list(self.messages)
        self.messages.append(Message("user", text))
        return self._reply(before, grammar)

    def regenerate(self) -> str:
        return "".join(self.stream_regenerate())

    def stream_regenerate(self) -> Iterator[str]:
        """Replace the last assistant reply with a new one (the prefix before it comes from the cache)."""
        if not self.messages or self.messages[-1].role != "assistant":
            raise PromptError("There is no reply to regenerate yet.")
        before = list(self.messages)
        self.messages.pop()
        return self._reply(before)

    def edit_last_user(self, text: str) -> str:
        return "".join(self.stream_edit_last_user(text))

    def stream_edit_last_user(self, text: str) -> Iterator[str]:
        """Replace the last user message (dropping the reply after it) and answer it again."""
        return self._reply(self._edit_last_user(text))

    def _edit_last_user(self, text: str) -> list[Message]:
        """Replace the last user message, dropping what follows it; the history before the edit."""
        users = [i for i, m in enumerate(self.messages) if m.role == "user"]
        if not users:
            raise PromptError("There is no message to edit yet.")
        if not text.strip():
            raise PromptError("The message is empty: type something first.")
        before = list(self.messages)
        self.messages = self.messages[: users[-1]] + [Message("user", text)]
        return before

    def fork(self) -> ChatSession:
        """An independent copy of this conversation; with the paged cache it shares the cached blocks."""
        twin = object.__new__(ChatSession)
        twin.__dict__.update(self.__dict__)
        twin.messages = list(self.messages)
        twin.caches = self.caches.fork()
        twin.store_id = twin.created_at = twin.restore_note = None  # a fork is a new session
        twin.saved_files = {}
        return twin

    def clear(self) -> None:
        """Forget the conversation but keep the system prompt (and its cached tokens)."""
        self.messages = self.messages[:1] if self.system is not None else []

    # turns on the batching scheduler ---------------------------------------------------

    def start_turn(self, text: str, batch: LocalBatch, n: int = 1) -> BatchedTurn:
        """A user message answered by the batching scheduler: ``n`` replies at once, generated as whoever
        runs ``batch``'s steps runs them; ``keep`` one (``sessions.batched_turn``)."""
        if not text.strip():
            raise PromptError("The message is empty: type something first.")
        before = list(self.messages)
        self.messages.append(Message("user", text))
        return self._batched(before, batch, n)

    def start_regenerate(self, batch: LocalBatch, n: int = 1) -> BatchedTurn:
        """``n`` new replies in place of the last one, on the batching scheduler."""
        if not self.messages or self.messages[-1].role != "assistant":
            raise PromptError("There is no reply to regenerate yet.")
        before = list(self.messages)
        self.messages.pop()
        return self._batched(before, batch, n)

    def start_edit_last_user(self, text: str, batch: LocalBatch, n: int = 1) -> BatchedTurn:
        """Replace the last user message (dropping the reply after it) and answer it on the scheduler."""
        return self._batched(self._edit_last_user(text), batch, n)

    def alternatives(self, text: str | None, n: int) -> Alternatives:
        """``n`` replies to ``text`` (None: regenerate the last reply) generated side by side, sharing the
        prompt's blocks. Iterate for (choice, text chunk) as they come, then ``keep(choice)``: that reply
        joins the history (``discard()`` keeps none)."""
        if n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        batch = LocalBatch(self.engine, max_running=max(n, 1))
        turn = self.start_regenerate(batch, n) if text is None else self.start_turn(text, batch, n)
        return Alternatives(turn)

    def _batched(self, before: list[Message], batch: LocalBatch, n: int) -> BatchedTurn:
        self.cut_in_thinking = False
        try:
            self._keep_system_in_window()
            return BatchedTurn(self, batch, before, n)
        except Exception:
            self.messages = before  # refused: the turn did not happen
            raise

    def stream_events(self, text: str, grammar: Grammar | None = None) -> Iterator[Event]:
        """Like ``stream``, but yields the Engine's events (token ids, draft flags, final stats)."""
        if not text.strip():
            raise PromptError("The message is empty: type something first.")
        before = list(self.messages)
        self.messages.append(Message("user", text))
        return self._events(before, grammar)

    def _reply(self, before: list[Message], grammar: Grammar | None = None) -> Iterator[str]:
        events = self._events(before, grammar)
        try:
            for event in events:
                if isinstance(event, TokenEvent) and event.text:
                    yield event.text
        finally:
            events.close()  # stopping the text stream stops the generation at once

    def _keep_system_in_window(self) -> None:
        """Rotating caches always keep the system prompt's tokens (settable until the window first fills)."""
        window = self.caches.target.window_size
        if window is None or self.system is None:
            return
        keep = len(render_chat(self.tokenizer, [self.messages[0].as_dict()], enable_thinking=False,
                               add_generation_prompt=False, tools=self.tool_schemas))
        if keep >= window:  # it would leave no room for the conversation
            raise SystemPromptTooLongError(f"The system prompt has {keep} tokens and does not fit in the rotating "
                                           f"KV window of {window}: use a bigger max_kv, or a shorter system prompt.")
        for cache in (self.caches.target, self.caches.draft):
            try:
                if cache is not None:
                    cache.keep = keep
            except CacheStateError:
                pass  # the window already filled: the keep it had stays (documented in mlxcore.kv.rotating)

    def _events(self, before: list[Message], grammar: Grammar | None = None) -> Generator[Event, None, None]:
        """The engine's events for the history as it stands; ``before`` is the history before this turn."""
        reply, written, lead, finish = "", [], "", None  # written: the reply's token ids
        events = None
        self.cut_in_thinking = False
        try:
            self._keep_system_in_window()
            prompt, lead = self._prompt()
            events = self.engine.generate(prompt, self.caches, self.params, self.prefill_progress, grammar,
                                          self.use_draft)
            for event in events:
                if isinstance(event, TokenEvent):
                    reply = reply + event.text
                    written.append(event.token)
                elif isinstance(event, FinalEvent):
                    reply, finish = event.text, event.finish_reason
                yield event
        except (PromptError, PoolExhaustedError):
            if not written:  # refused (too long, or no KV memory left for it): the turn did not happen
                self.messages = before
            raise
        except StopPrefill:
            pass  # stopped before the first token: the user's message stays, with no reply yet
        finally:  # a stopped reply is kept as it stands; the engine settled the caches
            if events is not None:
                events.close()
            self.last_stats = self.engine.last_stats
            if written:  # a reply cut inside <think> is closed, so that the next turn's template is well formed
                stored, self.cut_in_thinking = close_open_block(lead + self._as_held(reply, written, finish))
                self.messages.append(Message("assistant", stored))

    def _as_held(self, shown: str, ids: list[int], finish: str | None) -> str:
        """The reply's text as its ids spell it, which the next turn matches against the cache.

        The streamed text can differ: mlx-lm's detokenizer drops a reply's leading space.
        A reply cut at a stop string keeps the text shown (the cache holds the stop string too).
        An end token that closed the reply is not text; one the reply went on past (``ignore_eos``), and so
        showed, is kept as shown, even as the last token of a reply stopped or cut by its length.
        """
        if finish == "stop":
            return shown
        if ids and ids[-1] in self.engine.eos_ids and not shown.endswith(self.tokenizer.decode(ids[-1:])):
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids))

    # files ------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write the conversation and its caches to ``path``: the file this session was loaded from or saved
        to gets only what changed appended; another is written whole. A crash leaves its previous state
        (see sessions.session_file)."""
        from sessions.session_file import save_session
        save_session(self, Path(path))

    @classmethod
    def load(cls, path: str | Path, engine: Engine) -> ChatSession:
        """Open a session file on ``engine``; a file made with another model rebuilds its cache."""
        from sessions.session_file import read_session
        return cls.opened(read_session(Path(path), engine), engine)

    @classmethod
    def opened(cls, opened: Opened, engine: Engine) -> ChatSession:
        """The session a file or the store held (read and checked: ``sessions.session_file.Opened``), its caches
        restored; ``restore_note`` says what the next turn rebuilds."""
        from sessions.session_file import restore_caches

        saved = opened.saved
        use_draft = saved.use_draft or saved.draft_fingerprint is None  # saved without a draft: not a choice
        session = cls(engine, saved.system, saved.params, enable_thinking=saved.enable_thinking, use_draft=use_draft)
        session.messages.extend(saved.history)
        session.title, session.created_at = saved.title, saved.created
        restore_caches(opened, session)
        return session

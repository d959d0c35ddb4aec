"""The messages between the TUI and its engine host: small, frozen, picklable.

The UI sends commands; the engine host (a child process) owns the Engine, the open chats (the one on screen, and those still
answering in the background) and the session store, and answers with events.
Commands and events are about the chat on screen, except Generating (every chat).
Nothing here imports mlx, so the UI process stays free of model work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

Params = Mapping[str, object]  # GenerationParams fields by name, as plain data
Schema = dict[str, object]  # an OpenAI function schema (JSON)
KVKind = Literal["paged", "rotating", "standard"]  # --kv

# commands: UI -> engine ---------------------------------------------------------


@dataclass(frozen=True)
class Open:
    """Load the models and start a chat (a new one, a stored one, or a session file)."""

    model: str | None = None  # None = the default pair
    draft: str | None = None
    no_draft: bool = False
    kv: KVKind = "paged"
    max_kv: int | None = None
    max_kv_bytes: int | None = None  # --max-kv as a size: KV memory shared by the model and its draft
    block_size: int = 16
    kv_bits: int | None = None  # --kv-bits 8: keys and values in 8 bits
    disk_kv_bytes: int = 0  # --disk-kv: the KV disk tier's budget (0: off)
    disk_kv_dir: str | None = None  # and its folder
    num_draft: int = 8  # the most tokens the draft proposes per round (--num-draft)
    params: Params = field(default_factory=dict)  # GenerationParams fields given (a saved chat keeps the rest)
    system: str | None = None  # None: no system prompt, or the saved chat's
    think: bool | None = None  # None: on, or the saved chat's setting
    messages: tuple[tuple[str, str], ...] = ()  # start the new chat with these (role, content) messages
    session_file: str | None = None  # open this file (mlxchat --session FILE)
    session_id: str | None = None  # or this stored session


@dataclass(frozen=True)
class Send:
    text: str
    n: int = 1  # replies to generate side by side (the user keeps one with Pick)


@dataclass(frozen=True)
class Regenerate:
    n: int = 1  # as Send's: several new replies in place of the last one, to pick from


@dataclass(frozen=True)
class EditLast:
    text: str


@dataclass(frozen=True)
class Stop:
    """Stop the reply of the chat on screen (every one of its alternatives); what they have so far stays."""


@dataclass(frozen=True)
class Pick:
    """Keep alternative ``choice`` of the chat on screen as its reply; the others go."""

    choice: int


@dataclass(frozen=True)
class Configure:
    """Change the chat's settings; None leaves a setting as it is."""

    params: Params | None = None
    system: str | None = None  # "" removes the system prompt
    think: bool | None = None
    use_draft: bool | None = None


@dataclass(frozen=True)
class Chat:
    """Structural changes: "new", "fork", "clear", "save"."""

    action: Literal["new", "fork", "clear", "save"]


@dataclass(frozen=True)
class OpenSession:
    session_id: str


@dataclass(frozen=True)
class ManageSession:
    """Store operations on any session: "rename" (with title), "delete", "export" (with path)."""

    action: Literal["rename", "delete", "export"]
    session_id: str
    title: str | None = None
    path: str | None = None


@dataclass(frozen=True)
class ListSessions:
    query: str = ""


@dataclass(frozen=True)
class Tools:
    """The tools offered to the model from the next reply on (OpenAI function schemas; the window's MCP tools)."""

    schemas: tuple[Schema, ...]


@dataclass(frozen=True)
class ToolResults:
    """The results of the last reply's tool calls, in their order (run, refused or failed): the model goes on."""

    results: tuple[str, ...]


@dataclass(frozen=True)
class Shutdown:
    pass


Command = (Open | Send | Regenerate | EditLast | Stop | Pick | Configure | Chat | OpenSession | ManageSession
           | ListSessions | Tools | ToolResults | Shutdown)

# events: engine -> UI -------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """Download progress of a hub model."""

    done: int
    total: int


@dataclass(frozen=True)
class Ready:
    target: str
    draft: str | None
    note: str  # e.g. why the embedded models are used; "" when nothing to say
    defaults: Params = field(default_factory=dict)  # the sampling the model's generation_config.json sets
    batches: bool = True  # several chats answer at once (``Engine.batches``): a chat answering may be left


@dataclass(frozen=True)
class ReplySoFar:
    """One reply of a turn in progress, as far as it got (sent when its chat comes on screen)."""

    raw: str  # as generated (<think> tags included), as far as the Chunk events carried it
    ended: str = ""  # its finish reason once it ended; "" while it is generated


@dataclass(frozen=True)
class Conversation:
    """The whole state of the chat on screen, sent after every change of its shape."""

    session_id: str | None
    title: str
    messages: tuple[tuple[str, str], ...]  # (role, content); assistant content keeps <think>...</think>
    params: Params
    system: str | None
    think: bool
    use_draft: bool
    has_draft: bool
    save_error: str | None = None  # why the last save failed; None when the file holds this state
    file: str | None = None  # the session file that autosave writes (store or --session), once there is one
    turn: int = 0  # the turn in progress in this chat (numbered by the engine host); 0 when there is none
    replies: tuple[ReplySoFar, ...] = ()  # that turn's replies: one, or the alternatives side by side


@dataclass(frozen=True)
class Chunk:
    """Reply text generated since the last chunk (batched, a few per second)."""

    thinking: str
    answer: str
    pieces: int = 0  # text pieces generated since the last chunk (about one per token)
    raw: str = ""  # the same text as generated (<think> tags included): what the session stores
    choice: int = 0  # which of the turn's alternatives it belongs to


@dataclass(frozen=True)
class Prefill:
    """The prompt is being read (sent during a long prefill, a few times a second)."""

    done: int
    total: int


@dataclass(frozen=True)
class Done:
    """A reply ended: finished, stopped, or failed part way."""

    finish_reason: str
    stats: dict[str, object]  # GenerationStats fields plus prefill_tps, decode_tps, acceptance
    last_token_time: float  # time.monotonic() when the last chunk was sent (same clock in both processes)


@dataclass(frozen=True)
class ChoiceEnded:
    """One of the alternatives on screen ended (the turn waits for a Pick once all have)."""

    choice: int
    finish_reason: str  # "eos", "length", "stop", "stopped" or "error"


@dataclass(frozen=True)
class Generating:
    """The stored chats that have a reply in progress (on screen or not); sent when the sets change."""

    session_ids: tuple[str, ...]  # generating
    picking: tuple[str, ...] = ()  # their alternatives ended: waiting for the user to pick one


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    title: str
    updated: float
    messages: int
    broken: bool
    open_elsewhere: bool = False  # another mlxchat window has it open (it cannot be opened, renamed or deleted here)


@dataclass(frozen=True)
class Sessions:
    query: str
    rows: tuple[SessionRow, ...]


@dataclass(frozen=True)
class Notice:
    text: str
    severity: Literal["information", "warning", "error"] = "information"


class FailureCode(Enum):
    """What kind of error a Failure reports: what a UI acts on (the title and message are for people)."""

    UNEXPECTED = "unexpected"  # a bug: the message carries its trace
    ERROR = "error"  # refused, with no kind of its own: the message says why
    MODEL_LOAD = "model_load"  # a model cannot be loaded
    DRAFT_MISMATCH = "draft_mismatch"  # the draft model does not fit the model
    PROMPT = "prompt"  # the message cannot be sent (empty, too long): returned_text has it back
    SYSTEM_PROMPT_TOO_LONG = "system_prompt_too_long"
    SIDE_BY_SIDE = "side_by_side"  # several replies at once need the paged KV cache
    CACHE_FULL = "cache_full"  # the KV cache memory is full
    OVERLOADED = "overloaded"  # too many chats answering at once for the KV cache memory
    NOT_FOUND = "not_found"  # no stored chat with that id
    IN_USE = "in_use"  # the chat is open in another window
    NOT_SAVED = "not_saved"  # the chat could not be saved (it is still in memory and on screen)
    SESSION_FILE = "session_file"  # a session file cannot be read or written


@dataclass(frozen=True)
class Failure:
    """Something the user must know about, with what to do; fatal when there is no engine to use."""

    title: str
    message: str
    fatal: bool = False
    returned_text: str | None = None  # a refused message, for the input box
    code: FailureCode = FailureCode.ERROR


@dataclass(frozen=True)
class Exported:
    path: str


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as the model wrote it


@dataclass(frozen=True)
class ToolCalls:
    """The reply just kept calls tools: the window asks the user about each, runs it, and sends ToolResults."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class EngineGone:
    """Made by the UI's client, not the engine: the engine process ended unexpectedly."""

    exit_code: int | None
    log_path: str


Event = (Progress | Ready | Conversation | Chunk | Prefill | Done | ChoiceEnded | Generating | Sessions | Notice | Failure
         | Exported | ToolCalls | EngineGone)

"""The request bodies ``mlxchat serve`` accepts, as pydantic models.

Every model forbids fields it does not know (``extra="forbid"``) and is strict
about types (no "5" for 5), so a field we do not support, a wrong type or an
out-of-range value is a 400 that names it. Fields of OpenAI's API that the
current clients send: one with a meaning here is honoured; a hint or metadata
with none (``IGNORED``) is accepted, and said in the ``X-Mlxchat-Ignored-Fields``
header and the log (``ignored.py``); one that would change the reply and cannot
be honoured (penalties other than 0, ``echo``, ``audio``, ``logit_bias``) is a
400 with a sentence that says why (``refused``). ``response_format``
JSON modes and a ``tool_choice`` that forces a call become a grammar
(``mlxcore.grammar``, no MLX): a schema over the limits (``mlxcore.check_schema``:
a dict walk, no compiling) is a 400 here; the grammar is built and compiled once,
off the event loop, by ``app.serve.grammars``.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, ClassVar, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator,
                      model_validator)

from app.serve.pairing import check_pairing
from app.serve.settings import duration_seconds
from mlxcore import CALL_CLOSE, Grammar, check_schema, json_object, json_schema, thought_reply, tool_call_grammar

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1_000  # each stop string: a reply is checked against every one of them after each token
MAX_CHOICES = 16  # n: the choices share the prompt's blocks, but each decodes on its own
MAX_TITLE_CHARS = 200  # a session's title is a line in `mlxchat sessions ls`
AUDIO = "audio is not supported: mlxchat serve answers in text only (leave audio and modalities out)"

SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's "\ud800" escape parses to one; a pair parses to one character


def unicode_text(text: str) -> str:
    """``text`` if it can be encoded (tokenized, logged, stored): no lone surrogate; else ``ValueError``."""
    found = SURROGATE.search(text)
    if found:
        raise ValueError(f"it holds a lone surrogate ({found.group()!r} at character {found.start()}), which is "
                         "not text: send UTF-8, with surrogate escapes only in pairs")
    return text


def refused(why: str) -> AfterValidator:
    """A field's check: any value but none, false or empty is a 400 that says ``why`` (what cannot be honoured)."""
    def check(value: object) -> object:
        if value:
            raise ValueError(why)
        return value
    return AfterValidator(check)


def _text_only(kinds: list[str] | None) -> list[str] | None:
    if kinds and set(kinds) != {"text"}:
        raise ValueError(AUDIO)
    return kinds


Text = Annotated[str, AfterValidator(unicode_text)]
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]  # OpenAI's reasoning effort
THINKING_OFF = ("none", "minimal")  # the efforts at which Qwen3 answers without thinking
Title = Annotated[str, StringConstraints(max_length=MAX_TITLE_CHARS), AfterValidator(unicode_text)]


class Strict(BaseModel):
    """Unknown fields and loose types are errors."""

    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False  # a last chunk with the usage of the whole request
    include_obfuscation: bool | None = None  # padding against length side channels: none is sent


class TemplateKwargs(Strict):
    enable_thinking: bool | None = None  # Qwen3: think in <think>...</think> first; None: the server's default


class JSONSchemaFormat(Strict):
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: Text | None = None
    schema_: dict = Field(alias="schema")  # ("schema" is a BaseModel attribute)
    strict: bool | None = None  # OpenAI's; either way the reply follows the schema (a keyword it cannot is a 400)


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("response_format 'json_schema' needs a json_schema (name, schema), and only it does.")
        if self.json_schema is not None:
            check_schema(self.json_schema.schema_)  # limits and constructs, before any compiling
        return self

    def grammar(self) -> Grammar | None:
        """What the reply must match: None for text; ``ValueError`` for a schema that cannot be compiled
        (llguidance's work: not on the event loop)."""
        if self.type == "json_object":
            return json_object()
        if self.type == "json_schema":
            return json_schema(self.json_schema.schema_)
        return None


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionSpec(Strict):
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: Text | None = None
    parameters: dict | None = None  # a JSON schema; the chat template shows it to the model
    strict: bool | None = None  # OpenAI's: follow the schema exactly (without a grammar, the model is only asked to)


class Tool(Strict):
    type: Literal["function"]
    function: FunctionSpec


class FunctionCall(Strict):
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it

    @field_validator("arguments")
    @classmethod
    def _object(cls, arguments: str) -> str:
        try:
            if isinstance(json.loads(arguments), dict):
                return arguments
        except ValueError:
            pass
        raise ValueError("a tool call's arguments must be the JSON text of an object")


class ToolCallIn(Strict):
    """A call in an earlier assistant message, as the reply gave it."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
    index: int | None = None  # present when a client gathers a streamed call; nothing to the model


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(Strict):
    """One message; ``developer`` is OpenAI's newer name for ``system``.

    Clients append the reply objects they got back (the openai SDK's own multi-turn
    pattern), so the fields of OpenAI's replies are taken too: ``reasoning_content``
    (ours) goes back into the reply as the model wrote it; the others are taken
    only empty, as they come from a server with no tools, audio or refusals.
    """

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None only on an assistant's message that calls tools
    reasoning_content: Text | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: Text | None = None  # on a tool's result: the call it answers
    function_call: dict | None = None
    audio: dict | None = None
    annotations: list | None = None  # citations of a search: nothing the model needs to read

    @field_validator("content")
    @classmethod
    def _text(cls, content: str | list[TextPart] | None) -> str | list[TextPart] | None:
        if content is not None:
            unicode_text(content if isinstance(content, str) else "".join(p.text for p in content))
        return content

    @field_validator("refusal", "function_call", "audio")
    @classmethod
    def _empty(cls, value: object, info: ValidationInfo) -> None:
        if value:
            raise ValueError(f"{info.field_name} is not supported in messages: mlxchat serve has no audio, "
                             "refusals or legacy function_call. Send the reply's content (and tool_calls) only.")
        return None

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls belong to assistant messages only.")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("tool_call_id belongs to tool messages only.")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content (only an assistant's tool calls may go without)")
        return self

    @field_validator("reasoning_content")
    @classmethod
    def _on_replies(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("role") != "assistant":
            raise ValueError("reasoning_content belongs to assistant messages only.")
        return value

    def as_dict(self) -> dict[str, str]:
        """The message as the chat template takes it; a reply's reasoning in its think block, as generated."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or ())
        if self.reasoning_content is not None:
            text = thought_reply(self.reasoning_content, text)
        message = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump(exclude_none=True, exclude={"index"}) for call in self.tool_calls]
        return message | ({"tool_call_id": self.tool_call_id} if self.tool_call_id is not None else {})


def _duration(value: float | int | str | None) -> float | int | str | None:
    if value is not None:
        duration_seconds(value)  # a ValueError naming the field: a 400
    return value


KeepAlive = Annotated[float | int | str | None, AfterValidator(_duration)]  # seconds, or "5m"; negative: never


class Sampling(Strict):
    """Fields the chat and the completions endpoints share."""

    model: Text
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # extension (vLLM's): 0 = off
    min_p: float | None = Field(None, ge=0, lt=1)  # extension
    repetition_penalty: float | None = Field(None, gt=0)  # extension
    ignore_eos: bool | None = None  # extension (vLLM's): end of text does not end the reply (load tests)
    seed: int | None = None
    stop: str | list[str] | None = None  # at most MAX_STOP_STRINGS, each of 1 to MAX_STOP_CHARS characters
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    user: Text | None = None  # logged with the request
    priority: Literal["low", "normal", "high"] = "normal"  # extension: the scheduler's priority policy
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    keep_alive: KeepAlive = None  # Ollama's: how long the model stays loaded once idle (-1: always)

    @property
    def keep_alive_seconds(self) -> float | None:
        """``keep_alive`` in seconds (negative: never unload); None when the request gives none."""
        return None if self.keep_alive is None else duration_seconds(self.keep_alive)

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, not {len(stops)}")
        for text in stops:
            if not text:
                raise ValueError("a stop string must not be empty")
            if len(text) > MAX_STOP_CHARS:
                raise ValueError(f"a stop string has at most {MAX_STOP_CHARS:,} characters, not {len(text):,}")
            unicode_text(text)
        return stop

    @model_validator(mode="after")
    def _check_sampling(self) -> Sampling:
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0):
                raise ValueError(f"{name} is not supported (only 0); use repetition_penalty instead.")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true.")
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)  # None: until the end of the context
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name; wins over max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: TemplateKwargs | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: the reply ends after its first call (docs/tools.md)
    reasoning_effort: Effort | None = None  # none or minimal: Qwen3 answers without thinking; others: it thinks
    modalities: Annotated[list[Literal["text", "audio"]] | None, AfterValidator(_text_only)] = None
    # hints and metadata with no meaning here: accepted and ignored (said in a header and the log)
    metadata: dict[str, str] | None = None
    store: bool | None = None  # nothing is stored, whatever it says
    prompt_cache_key: str | None = None  # the prefix cache finds shared prefixes by itself
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict | None = None
    safety_identifier: Text | None = None
    service_tier: str | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint to OpenAI's models
    prediction: dict | None = None  # predicted output: a speed hint; the reply is the same without it
    IGNORED: ClassVar[tuple[str, ...]] = ("metadata", "store", "prompt_cache_key", "prompt_cache_retention",
                                          "prompt_cache_options", "safety_identifier", "service_tier", "verbosity",
                                          "prediction")
    # what would change the reply and cannot be honoured
    audio: Annotated[dict | None, refused(AUDIO)] = None
    logit_bias: Annotated[dict[str, float] | None, refused(
        "logit_bias is not supported: the sampler takes no per-token bias (leave it out, or send {})")] = None
    moderation: Annotated[dict | None, refused("moderation is not supported: no moderation model runs here")] = None
    web_search_options: Annotated[dict | None, refused(
        "web search is not supported: this server runs no hosted tools (offer a function tool instead)")] = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true.")
        if self.tool_choice is not None and not self.tools and self.tool_choice != "none":
            raise ValueError("tool_choice needs tools.")
        check_pairing(self.messages)  # (the three APIs' requests all come through here)
        if self.forced_call:
            self._check_forced_call()
        return self

    def _check_forced_call(self) -> None:
        """The tool named exists; the schemas of the tools a call may go to keep ``check_schema``'s limits (they
        become the grammar, as response_format's schema does)."""
        name = self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None
        names = [tool.function.name for tool in self.tools or ()]
        if name is not None and name not in names:
            raise ValueError(f"tool_choice names {name!r}, which is not one of the tools: {', '.join(names)}.")
        for tool in self.tools or ():
            if tool.function.parameters is not None and (name is None or tool.function.name == name):
                check_schema(tool.function.parameters, f"parameters schema of the tool {tool.function.name!r}")

    @property
    def forced_call(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    @property
    def constrained(self) -> bool:
        """Whether the reply follows a grammar (``build_grammar`` is not None)."""
        return self.forced_call or (self.response_format is not None and self.response_format.type != "text")

    def build_grammar(self) -> Grammar | None:
        """What the reply must match after any thinking: a forced tool call, or the response format's JSON;
        ``ValueError`` naming what cannot be compiled. llguidance's work: off the event loop (``grammars``)."""
        if self.forced_call:
            name = self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None
            return tool_call_grammar(self.offered_tools, name, parallel=self.parallel_tool_calls is not False)
        return self.response_format.grammar() if self.response_format is not None else None

    def grammar_source(self) -> object:
        """What the grammar is built from (for the log of a refused one): the schema or the tools."""
        if self.forced_call:
            return self.offered_tools
        return self.response_format.json_schema.schema_ if self.response_format and self.response_format.json_schema \
            else None

    @property
    def offered_tools(self) -> list[dict] | None:
        """The tools shown to the model and read back from its reply: none with tool_choice 'none'."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The client's stop strings; with parallel_tool_calls false, also the end of the first call."""
        one_call = self.offered_tools is not None and self.parallel_tool_calls is False
        return super().stop_strings + ((CALL_CLOSE,) if one_call else ())

    @property
    def reply_cap(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def thinking(self, default: bool) -> bool:
        """Whether the model thinks first: the request's ``enable_thinking``, else its ``reasoning_effort``, else
        ``default``."""
        asked = self.chat_template_kwargs.enable_thinking if self.chat_template_kwargs else None
        if asked is None and self.reasoning_effort is not None:
            asked = self.reasoning_effort not in THINKING_OFF
        return default if asked is None else asked


PROMPT_SHAPES = ("prompt must be a non-empty string or a non-empty list of token ids (integers >= 0), one prompt "
                 "per request: send several requests for several prompts")


def _one_prompt(prompt: object) -> str | list[int]:
    """The prompt as text or token ids, unwrapped from a batch of one; ``ValueError`` for any other shape."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return unicode_text(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
        return prompt
    raise ValueError(PROMPT_SHAPES)


class CompletionRequest(Sampling):
    """``POST /v1/completions``: the prompt as text or token ids, one prompt per request."""

    prompt: str | list
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for this endpoint
    logprobs: int | None = Field(None, ge=0, le=20)  # also this many likeliest tokens at each position
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _single(cls, prompt: object) -> str | list[int]:
        return _one_prompt(prompt)

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported: the reply holds the completion only.")
        return self


class SessionSaveRequest(Strict):
    """``POST /v1/sessions/{name}/save``: the conversation to store, with its KV cache."""

    messages: list[ChatMessage] = Field(min_length=1)
    chat_template_kwargs: TemplateKwargs | None = None
    title: Title | None = None  # shown in `mlxchat sessions ls`; default: from the first user message

    @field_validator("messages")
    @classmethod
    def _no_calls(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        # a stored session keeps a reply as the model wrote it; calls sent as tool_calls are not that text yet
        if any(m.tool_calls for m in messages):
            raise ValueError("a session with tool calls cannot be saved over HTTP yet (its replies are stored as "
                             "the model wrote them; sent as tool_calls they would be lost): save it without them")
        return messages

    def thinking(self, default: bool) -> bool:
        """Whether the model thinks first: the request's ``enable_thinking``, else ``default``."""
        asked = self.chat_template_kwargs.enable_thinking if self.chat_template_kwargs else None
        return default if asked is None else asked

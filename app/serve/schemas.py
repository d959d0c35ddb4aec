"""The request bodies ``mlxchat serve`` accepts, as pydantic models.

Every model forbids fields it does not know (``extra="forbid"``) and is strict
about types (no "5" for 5), so a field we do not support, a wrong type or an
out-of-range value is a 400 that names it, never silently ignored. Fields that
OpenAI's API has but that we cannot honour (``response_format`` JSON modes,
penalties other than 0, ``echo``) are refused by validators, with a sentence
that says why.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator,
                      model_validator)

from mlxcore.think_blocks import thought_reply

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1_000  # each stop string: a reply is checked against every one of them after each token
MAX_CHOICES = 16  # n: the choices share the prompt's blocks, but each decodes on its own
MAX_TITLE_CHARS = 200  # a session's title is a line in `mlxchat sessions ls`

SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's "\ud800" escape parses to one; a pair parses to one character


def unicode_text(text: str) -> str:
    """``text`` if it can be encoded (tokenized, logged, stored): no lone surrogate; else ``ValueError``."""
    found = SURROGATE.search(text)
    if found:
        raise ValueError(f"it holds a lone surrogate ({found.group()!r} at character {found.start()}), which is "
                         "not text: send UTF-8, with surrogate escapes only in pairs")
    return text


Text = Annotated[str, AfterValidator(unicode_text)]
Title = Annotated[str, StringConstraints(max_length=MAX_TITLE_CHARS), AfterValidator(unicode_text)]


class Strict(BaseModel):
    """Unknown fields and loose types are errors."""

    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False  # a last chunk with the usage of the whole request


class TemplateKwargs(Strict):
    enable_thinking: bool | None = None  # Qwen3: think in <think>...</think> first; None: the server's default


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict | None = None

    @model_validator(mode="after")
    def _only_text(self) -> ResponseFormat:
        if self.type != "text":
            raise ValueError(f"response_format {self.type!r} is not supported: mlxchat serve has no constrained "
                             "decoding, so it cannot promise JSON. Ask for JSON in the prompt instead, or leave "
                             "response_format out.")
        return self


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    """One message; ``developer`` is OpenAI's newer name for ``system``.

    Clients append the reply objects they got back (the openai SDK's own multi-turn
    pattern), so the fields of OpenAI's replies are taken too: ``reasoning_content``
    (ours) goes back into the reply as the model wrote it; the others are taken
    only empty, as they come from a server with no tools, audio or refusals.
    """

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart]
    reasoning_content: Text | None = None
    refusal: str | None = None
    tool_calls: list | None = None
    function_call: dict | None = None
    audio: dict | None = None
    annotations: list | None = None  # citations of a search: nothing the model needs to read

    @field_validator("content")
    @classmethod
    def _text(cls, content: str | list[TextPart]) -> str | list[TextPart]:
        unicode_text(content if isinstance(content, str) else "".join(p.text for p in content))
        return content

    @field_validator("refusal", "tool_calls", "function_call", "audio")
    @classmethod
    def _empty(cls, value: object, info: ValidationInfo) -> None:
        if value:
            raise ValueError(f"{info.field_name} is not supported in messages: mlxchat serve has no tools, "
                             "audio or refusals yet. Send the reply's content only.")
        return None

    @field_validator("reasoning_content")
    @classmethod
    def _on_replies(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("role") != "assistant":
            raise ValueError("reasoning_content belongs to assistant messages only.")
        return value

    def as_dict(self) -> dict[str, str]:
        """The message as the chat template takes it; a reply's reasoning in its think block, as generated."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        if self.reasoning_content is not None:
            text = thought_reply(self.reasoning_content, text)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class Sampling(Strict):
    """Fields the chat and the completions endpoints share."""

    model: Text
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # extension (vLLM's): 0 = off
    min_p: float | None = Field(None, ge=0, lt=1)  # extension
    repetition_penalty: float | None = Field(None, gt=0)  # extension
    seed: int | None = None
    stop: str | list[str] | None = None  # at most MAX_STOP_STRINGS, each of 1 to MAX_STOP_CHARS characters
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    user: Text | None = None  # logged with the request
    priority: Literal["low", "normal", "high"] = "normal"  # extension: the scheduler's priority policy
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None

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

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true.")
        return self

    @property
    def reply_cap(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def thinking(self, default: bool) -> bool:
        """Whether the model thinks first: the request's ``enable_thinking``, else ``default``."""
        asked = self.chat_template_kwargs.enable_thinking if self.chat_template_kwargs else None
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

    def thinking(self, default: bool) -> bool:
        """Whether the model thinks first: the request's ``enable_thinking``, else ``default``."""
        asked = self.chat_template_kwargs.enable_thinking if self.chat_template_kwargs else None
        return default if asked is None else asked

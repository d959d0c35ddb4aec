"""The request body of OpenAI's Responses API (``POST /v1/responses``), as pydantic models.

As in ``schemas.py``, unknown fields and loose types are a 400 that names the
field. ``input`` items are told apart by ``type`` (a message may leave it out, as
OpenAI's "easy" messages do); an item type we cannot render (images, files,
hosted tools' calls) is a 400 at its place (``input.3``). ``tools`` are kept
as given: the translation takes the function tools and drops the others with a
warning (``docs/responses.md`` says why).
"""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field, model_validator

from app.serve.schemas import Effort, KeepAlive, Strict, Text, refused


def _typed(item: object) -> object:
    """A message item may come without ``type``."""
    if isinstance(item, dict) and "type" not in item and "role" in item:
        return {"type": "message"} | item
    return item


def _as_parts(content: object) -> object:
    """A string is one text part: both spellings are OpenAI's, and a wrong part is then named by its place."""
    return [{"type": "input_text", "text": content}] if isinstance(content, str) else content


def _as_items(given: object) -> object:
    """A string input is one user message."""
    return [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given


class InputText(Strict):
    type: Literal["input_text"]
    text: Text


class OutputText(Strict):
    """The text of an earlier reply, sent back as the response gave it."""

    type: Literal["output_text"]
    text: Text
    annotations: list | None = None
    logprobs: list | None = None


Part = Annotated[InputText | OutputText, Field(discriminator="type")]


class MessageItem(Strict):
    type: Literal["message"]
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[list[Part], BeforeValidator(_as_parts)]
    id: str | None = None
    status: str | None = None
    phase: str | None = None  # Codex's "commentary" or "final_answer": nothing the model reads

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content)  # as the chat endpoint joins a message's text parts


class FunctionCallItem(Strict):
    """A call an earlier reply made."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text of an object
    id: str | None = None
    status: str | None = None

    @model_validator(mode="after")
    def _object(self) -> FunctionCallItem:
        try:
            if isinstance(json.loads(self.arguments), dict):
                return self
        except ValueError:
            pass
        raise ValueError("a function call's arguments must be the JSON text of an object")


class FunctionCallOutputItem(Strict):
    """A call's result: text, or ``input_text`` parts."""

    type: Literal["function_call_output"]
    call_id: str
    output: Annotated[list[InputText], BeforeValidator(_as_parts)]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.output)


class SummaryText(Strict):
    type: Literal["summary_text"]
    text: Text


class ReasoningText(Strict):
    type: Literal["reasoning_text", "text"]  # Codex keeps both spellings
    text: Text


class ReasoningItem(Strict):
    """An earlier reply's reasoning: ours carry it as ``content``; a summary stands in when there is none."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None  # OpenAI's: nothing we could read
    status: str | None = None

    @property
    def text(self) -> str:
        parts = self.content or self.summary
        return "\n\n".join(part.text for part in parts)


Item = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
                 Field(discriminator="type"), BeforeValidator(_typed)]


class TextFormat(Strict):
    """The reply's format: text, or JSON (any object, or following ``schema``) by a grammar."""

    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None  # of a json_schema format (the API requires it; ours defaults to "output")
    schema_: dict | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint to OpenAI's models; accepted and ignored


class Reasoning(Strict):
    """``effort`` none or minimal: Qwen3 answers without thinking; low to xhigh: it thinks first."""

    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed", "none"] | None = None  # the reasoning is sent whole
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the older name of summary


class FunctionChoice(Strict):
    """``tool_choice`` naming a function: the reply is a call of it."""

    type: Literal["function"]
    name: str


class StreamOptions(Strict):
    include_obfuscation: bool | None = None  # padding against length side channels: none is sent


class ResponsesRequest(Strict):
    """``POST /v1/responses``. Stateless: ``previous_response_id`` and ``conversation`` are refused (400)."""

    model: Text
    input: Annotated[list[Item], BeforeValidator(_as_items)]
    instructions: Text | None = None
    tools: list[dict] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    previous_response_id: str | None = None
    conversation: str | dict | None = None
    store: bool | None = None  # nothing is stored, whatever it says (docs/responses.md)
    include: list[str] | None = None  # e.g. "reasoning.encrypted_content": our reasoning is sent as text
    metadata: dict[str, str] | None = None  # echoed in the response
    user: Text | None = None  # logged with the request
    safety_identifier: Text | None = None
    prompt_cache_key: str | None = None  # the prefix cache finds shared prefixes by itself
    service_tier: str | None = None
    keep_alive: KeepAlive = None  # extension, as on the chat endpoint (Ollama's): how long the model stays loaded
    client_metadata: dict[str, str] | None = None  # Codex's; nothing the model reads
    truncation: Literal["disabled"] | None = None  # "auto" (dropping turns to fit) is not offered
    priority: Literal["low", "normal", "high"] = "normal"  # extension, as on the chat endpoint
    top_k: int | None = Field(None, ge=0)  # extension (vLLM's): 0 = off
    seed: int | None = None  # extension
    # hints and options with no meaning here: accepted and ignored (said in a header and the log)
    prompt_cache_options: dict | None = None
    prompt_cache_retention: str | None = None
    context_management: list[dict] | None = None  # server-side compaction: the client's own compaction still runs
    max_tool_calls: int | None = Field(None, ge=0)  # of hosted tools, which are not offered here
    image: dict | None = None  # options of generated images: none are made
    access_programs: dict | None = None
    background_options: dict | None = None
    IGNORED: ClassVar[tuple[str, ...]] = ("metadata", "store", "include", "safety_identifier", "prompt_cache_key",
                                          "service_tier", "client_metadata", "prompt_cache_options",
                                          "prompt_cache_retention", "context_management", "max_tool_calls", "image",
                                          "access_programs", "background_options")
    # what would change the reply and cannot be honoured
    background: Annotated[bool | None, refused(
        "background is not supported: the reply comes on this request (stream it to follow it)")] = None
    moderation: Annotated[dict | None, refused("moderation is not supported: no moderation model runs here")] = None
    prompt: Annotated[dict | None, refused(
        "prompt (a stored prompt template) is not supported: send instructions and input instead")] = None
    top_logprobs: Annotated[int | None, refused("top_logprobs is not supported on /v1/responses yet: use the chat "
                                                "endpoint's logprobs")] = None

"""The request bodies of Anthropic's Messages API, as pydantic models.

As in ``schemas.py``, unknown fields and loose types are a 400 that names the
field. Content given as a plain string is taken as one text block, so that a
wrong block is reported at its own place (``messages.0.content.1.type``), not
as a string that was expected. Tools are Anthropic's custom tools (``name``,
``description``, ``input_schema``); its server tools (web search, code execution,
...) run on Anthropic's side and are a 400 that says so.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints, model_validator

from app.serve.schemas import MAX_STOP_CHARS, MAX_STOP_STRINGS, KeepAlive, Strict, Text, unicode_text


def _as_blocks(content: object) -> object:
    """A string is one text block: Anthropic takes both spellings."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


class CacheControl(Strict):
    """Accepted and ignored: the prefix cache finds every shared prefix by itself."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Strict):
    type: Literal["text"]
    text: Text
    cache_control: CacheControl | None = None
    citations: list[dict] | None = None  # sources of a reply's text: nothing the model reads

    @model_validator(mode="after")
    def _no_citations(self) -> TextBlock:
        if self.citations:
            raise ValueError("citations are not supported: send the text only")
        return self


class ThinkingBlock(Strict):
    """An earlier reply's reasoning (Qwen3's think block)."""

    type: Literal["thinking"]
    thinking: Text
    signature: str | None = None  # ours are empty: there is nothing to verify


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict
    cache_control: CacheControl | None = None


class ToolResultBlock(Strict):
    """A tool's result; only text (images are a 400); ``is_error`` marks the text as an error for the model."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


Block = Annotated[TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class Message(Strict):
    """A turn; a ``system`` one (Claude Code sends them since 2.1, after its first user turn) holds text only and
    is rendered where it stands, as Qwen's template renders a system turn that is not the first."""

    role: Literal["user", "assistant", "system"]
    content: Annotated[list[Block], BeforeValidator(_as_blocks)]


class ThinkingConfig(Strict):
    """Qwen3 thinks first (``enabled``, ``adaptive``) or not. The budget is not enforced: ``max_tokens`` bounds
    the reasoning and the answer together, as Anthropic's API counts them."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(None, ge=1)
    # A hint: the text is sent either way. With "omitted" (Claude Code 2.1.3xx sends it) Anthropic sends a signature
    # that carries the reasoning back next turn; ours carry nothing, and Qwen's template needs the text of a tool
    # loop's reasoning sent back to render the prompt the model wrote (and find it in the prefix cache).
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(Strict):
    """Structured output: the answer is JSON that follows ``schema`` (the chat endpoint's ``json_schema``)."""

    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")  # ("schema" is a BaseModel attribute)


class OutputConfig(Strict):
    """``effort`` is accepted and ignored (a hint to Claude models); ``format``: structured output."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class AnthropicTool(Strict):
    """A custom tool: the model sees its name, description and input schema through the chat template."""

    type: Literal["custom"] | None = None
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: Text | None = None
    input_schema: dict
    cache_control: CacheControl | None = None
    strict: bool | None = None  # follow the schema exactly: without a grammar the model is only asked to
    # accepted and ignored: every tool is shown to the model, called by it directly, and sent whole once parsed
    allowed_callers: list[str] | None = None
    defer_loading: bool | None = None
    eager_input_streaming: bool | None = None
    input_examples: list[dict] | None = None

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, data: object) -> object:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in (None, "custom"):
            raise ValueError(f"tool type {kind!r} is a server tool, which Anthropic runs on its side; mlxchat serve "
                             "runs none: send custom tools (name, description, input_schema) only")
        return data


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # the tool to call, with "tool" (only)
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice 'tool' needs the tool's name, and only it takes one")
        return self


class Metadata(Strict):
    user_id: str | None = None  # accepted and ignored


class ContextManagement(Strict):
    """Accepted and ignored: Anthropic's context editing (clear earlier thinking, or earlier tool results once the
    prompt outgrows a trigger) saves tokens on its side. Qwen's template already leaves earlier turns' thinking
    out, and a prompt that outgrows the context here is a 400 that says so. The edits are not read: new kinds
    come with new releases of Claude Code, and none changes what the reply means."""

    edits: list[dict] | None = None


StopSequence = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS), AfterValidator(unicode_text)]


class MessagesPrompt(Strict):
    """What both endpoints render into a prompt; ``POST /v1/messages/count_tokens`` takes only this."""

    model: Text
    messages: list[Message] = Field(min_length=1)
    system: Annotated[list[TextBlock], BeforeValidator(_as_blocks)] | None = None
    thinking: ThinkingConfig | None = None  # None: the server's default (--no-think), as the chat endpoint's
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None


class MessagesRequest(MessagesPrompt):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)  # required, as Anthropic's API requires it
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[StopSequence] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stream: bool = False
    metadata: Metadata | None = None
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    keep_alive: KeepAlive = None  # extension, as on the chat endpoint (Ollama's): how long the model stays loaded

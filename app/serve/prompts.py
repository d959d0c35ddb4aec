"""An HTTP request body -> the scheduler's ``Request``: prompt ids, sampling, priority.

Sampling starts from the model's recommended defaults (its
generation_config.json, ``Engine.default_params``) and the fields the client
gave override them, so a client that sends nothing samples as the model card says.
"""

from __future__ import annotations

from app.serve.errors import APIError
from app.serve.grammars import request_grammar
from app.serve.schemas import ChatCompletionRequest, CompletionRequest, Sampling
from app.serve.state import ModelInfo
from app.serve.tokenizing import Tokenizing
from mlxcore import Priority, Request
from mlxcore import OPEN, GenerationParams, Grammar, PromptError, thought_reply

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "ignore_eos")


def generation_params(body: Sampling, defaults: GenerationParams, max_tokens: int | None) -> GenerationParams:
    """``defaults`` with the sampling fields the client gave, its reply cap and its stop strings."""
    given = {name: getattr(body, name) for name in _SAMPLING_FIELDS if getattr(body, name) is not None}
    cap = defaults.max_tokens if max_tokens is None else max_tokens  # the server's --max-tokens, if any
    try:
        return defaults.replaced({**given, "max_tokens": cap, "stop": body.stop_strings})
    except ValueError as error:  # a combination the schema could not see
        raise APIError(400, f"Invalid request: {error}.") from None


def scheduler_request(body: Sampling, prompt_ids: list[int], params: GenerationParams, top_logprobs: int,
                      model: ModelInfo, grammar: Grammar | None = None) -> Request:
    """The worker's request for ``body``: its priority and how many alternatives to report per token.

    A prompt over the context is refused here, before a stream's 200 is sent (the scheduler would refuse it too).
    """
    if not prompt_ids:
        raise APIError(400, "The prompt is empty.", param="prompt")
    _within_context(len(prompt_ids), model, "messages" if isinstance(body, ChatCompletionRequest) else "prompt")
    # With a draft, which random draws a sampled reply uses depends on the draft lengths the engine has
    # learned (they change from request to request): a seeded sampled reply decodes plainly, to repeat.
    reproducible = params.seed is not None and params.temperature > 0
    return Request(prompt_ids=tuple(prompt_ids), params=params, priority=Priority.parse(body.priority),
                   top_logprobs=top_logprobs, use_draft=not reproducible, grammar=grammar)


def _within_context(tokens: int, model: ModelInfo, param: str, *, at_least: bool = False) -> None:
    if model.context_length is not None and tokens >= model.context_length:
        count = f"at least {tokens:,}" if at_least else f"{tokens:,}"
        room = f"the model's context of {model.context_length}" if model.context_length == model.trained_context \
            else f"the {model.context_length:,} tokens the server's KV memory holds for one request (--max-kv)"
        raise APIError(400, f"The prompt has {count} tokens, more than {room}: shorten it.", param=param,
                       code="context_length_exceeded")


async def prompt_ids(text: str, tokens: Tokenizing, model: ModelInfo, param: str) -> list[int]:
    """``text`` tokenized, unless it is certainly over the context: then refused before (see ``tokenizing``)."""
    _within_context(tokens.fewest_tokens(text), model, param, at_least=True)
    return await tokens.text_ids(text)


def with_system(messages: list[dict], system: str | None) -> list[dict]:
    """``messages`` with the server's default system prompt first, when they bring none."""
    if system is None or messages[0]["role"] == "system":
        return messages
    return [{"role": "system", "content": system}] + messages


def with_empty_blocks(messages: list[dict]) -> list[dict]:
    """With thinking off, earlier replies as the model wrote them: after the empty think block.

    Clients send back the answer only; Qwen3's template would then render the reply without the block
    its generation prompt held, and the KV cache would stop matching where the reply began
    (``mlxcore.think_blocks``). Put back, the whole conversation so far comes from the cache.
    """
    return [m | {"content": thought_reply("", m["content"])}
            if m["role"] == "assistant" and not m["content"].lstrip().startswith(OPEN) else m for m in messages]


async def chat_prompt_ids(body: ChatCompletionRequest, tokens: Tokenizing, model: ModelInfo, *, thinking: bool,
                          system: str | None = None) -> list[int]:
    """The conversation rendered with the model's chat template (thinking on or off) and tokenized, ready for
    the reply; what Anthropic's ``count_tokens`` counts too."""
    messages = with_system([message.as_dict() for message in body.messages], system)
    if not thinking:
        messages = with_empty_blocks(messages)
    try:
        text = await tokens.chat_text(messages, thinking, tools=body.offered_tools)
    except PromptError as error:
        raise APIError(400, str(error), param="messages") from None
    return await prompt_ids(text, tokens, model, "messages")


async def chat_request(body: ChatCompletionRequest, tokens: Tokenizing, model: ModelInfo, *, thinking: bool,
                       system: str | None = None) -> Request:
    """The scheduler's request for one reply to the conversation (``chat_prompt_ids``), its grammar compiled."""
    grammar = await request_grammar(body, model)
    ids = await chat_prompt_ids(body, tokens, model, thinking=thinking, system=system)
    params = generation_params(body, model.default_params, body.reply_cap)
    return scheduler_request(body, ids, params, (body.top_logprobs or 0) if body.logprobs else 0, model, grammar)


async def completion_request(body: CompletionRequest, tokens: Tokenizing, model: ModelInfo) -> Request:
    """The prompt as given: text (tokenized, no template) or token ids (checked against the vocabulary)."""
    prompt = body.prompt
    ids = await prompt_ids(prompt, tokens, model, "prompt") if isinstance(prompt, str) else list(prompt)
    if any(token >= model.vocab_size for token in ids):
        raise APIError(400, f"The prompt has token ids outside the vocabulary (0..{model.vocab_size - 1}).",
                       param="prompt")
    params = generation_params(body, model.default_params, body.max_tokens)
    return scheduler_request(body, ids, params, body.logprobs or 0, model)

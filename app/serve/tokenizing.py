"""Chat templates and tokenization, off the event loop.

A chat template is code from the model folder, so it always renders off the
loop, in a worker process with a deadline (``templates``), waited for on a thread
of its own. Encoding a long conversation takes milliseconds (a large body, most
of a second); on the loop that would stall every stream the server is sending, so
long texts go to one helper thread (one, so that our side never uses the
tokenizer from two threads at once). Short ones (most chat turns) are done on
the loop: handing them over costs more than that.
No MLX here: the tokenizer is the model's Hugging Face tokenizer.

Tokenizing a text far over the context is costly for nothing (4 MB: seconds,
and hundreds of MB the process keeps), so a prompt is first measured against a
lower bound on its tokens that costs nothing: no token stands for more
characters than the longest entry of the vocabulary (``fewest_tokens``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache, partial

from app.serve.errors import APIError
from app.serve.templates import TemplateError, TemplateWorker, WorkerTemplates

log = logging.getLogger("mlxchat.serve")

INLINE_CHARS = 16_384  # texts up to this long are tokenized on the loop
# Normalizers that only compose: NFC puts at most 4 code points into one character (U+1F82 is a, 3 marks).
COMPOSING = {None: 1, "NFC": 4, "NFKC": 4}


def longest_token_chars(tokenizer) -> int | None:
    """The most characters of text one token can stand for; None when unknown (then nothing is bounded).

    A byte-level vocabulary spells each byte as one character, and a character is
    at least one byte, so its longest entry bounds a token's text; a normalizer that
    composes characters first multiplies that bound; one that may drop text (strip,
    accents) leaves no bound.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(tokenizer, "get_vocab"):
        return None
    normalizer = backend.normalizer
    factor = COMPOSING.get(None if normalizer is None else type(normalizer).__name__)
    return None if factor is None else factor * max(map(len, tokenizer.get_vocab()))


class Tokenizing:
    """The model's tokenizer behind ``async`` calls that run on one helper thread."""

    def __init__(self, tokenizer, templates: TemplateWorker) -> None:
        self.tokenizer = tokenizer
        self.templates = WorkerTemplates(tokenizer, templates)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        self._render = ThreadPoolExecutor(max_workers=1, thread_name_prefix="template")  # (one worker process)
        self.token_text = lru_cache(maxsize=65536)(self._token_text)
        self.token_chars = longest_token_chars(tokenizer)  # read once: the vocabulary is a big dict

    async def _run(self, chars: int, fn, *args, **kwargs):
        if chars <= INLINE_CHARS:
            return fn(*args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._thread, partial(fn, *args, **kwargs))

    async def chat_text(self, messages: Sequence[dict], enable_thinking: bool,
                        add_generation_prompt: bool = True, tools: Sequence[dict] | None = None) -> str:
        """``messages`` rendered by the model's chat template, ready for the reply (``add_generation_prompt``;
        without it, as a conversation that ends there is cached), ``tools`` offered; ``text_ids`` tokenizes it."""
        render = partial(self.templates.render, messages, enable_thinking, add_generation_prompt, tools)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._render, render)
        except TemplateError as error:
            log.warning("the chat template failed: %s", error)  # (one line: no traceback of the model's code)
            if error.refused:
                raise APIError(400, f"The model's chat template refused these messages: {error}",
                               param="messages", code="chat_template_refused") from None
            raise APIError(500, f"The model's chat template failed: {str(error).rstrip('.')}.",
                           code="chat_template_failed") from None

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on the tokens of ``text``, without tokenizing it (0 when the tokenizer gives none)."""
        return -(-len(text) // self.token_chars) if self.token_chars else 0

    async def text_ids(self, text: str) -> list[int]:
        """``text`` as token ids, with no template and no special tokens added."""
        return await self._run(len(text), lambda: list(self.tokenizer.encode(text, add_special_tokens=False)))

    def _token_text(self, token: int) -> str:
        """The text of one token (how OpenAI's logprobs name it); cached, so cheap on the loop."""
        return self.tokenizer.decode([token])

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        self._render.shutdown(wait=False, cancel_futures=True)
        self.templates.worker.close()

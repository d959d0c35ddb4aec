"""Chat templates and tokenization, off the event loop when the text is long.

Rendering and encoding a long conversation takes milliseconds (about 2 ms per
10 KB here, 0.7 s for a 4 MB body); on the loop that would stall every stream
the server is sending, so long texts go to one helper thread (one, so that our
side never uses the tokenizer from two threads at once). Short ones (most chat
turns: 0.06 ms) are done on the loop: handing them over costs more than that.
No MLX here: the tokenizer is the model's Hugging Face tokenizer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache, partial

from mlxcore.chat_template import render_chat


INLINE_CHARS = 16_384  # texts up to this long are tokenized on the loop


class Tokenizing:
    """The model's tokenizer behind ``async`` calls that run on one helper thread."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        self.token_text = lru_cache(maxsize=65536)(self._token_text)

    async def _run(self, chars: int, fn, *args, **kwargs):
        if chars <= INLINE_CHARS:
            return fn(*args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._thread, partial(fn, *args, **kwargs))

    async def chat_ids(self, messages: Sequence[dict], enable_thinking: bool,
                       add_generation_prompt: bool = True) -> list[int]:
        """The prompt ids of ``messages``, rendered by the model's chat template, ready for the reply
        (``add_generation_prompt``; without it, as a conversation that ends there is cached)."""
        chars = sum(len(m["content"]) for m in messages)
        return await self._run(chars, render_chat, self.tokenizer, messages, enable_thinking=enable_thinking,
                               add_generation_prompt=add_generation_prompt)

    async def text_ids(self, text: str) -> list[int]:
        """``text`` as token ids, with no template and no special tokens added."""
        return await self._run(len(text), lambda: list(self.tokenizer.encode(text, add_special_tokens=False)))

    def _token_text(self, token: int) -> str:
        """The text of one token (how OpenAI's logprobs name it); cached, so cheap on the loop."""
        return self.tokenizer.decode([token])

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

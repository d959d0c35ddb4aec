"""One request in flight: its handles, the choices being built, its timing, and what it leaves behind.

``Exchange.open`` submits the request (all of its ``n`` choices, sharing the
prompt's blocks), ``open_chat`` a chat request as the chat endpoint and
Anthropic's Messages endpoint build it; ``wait`` follows a reply that is not
streamed; ``finish`` observes the latencies into the metrics and writes
the request's log summary, whether it ended, failed or its client left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request as HTTPRequest

from app.serve.choices import ChoiceState, usage
from app.serve.errors import APIError
from app.serve.prompts import chat_request
from app.serve.registry import ServedModel
from app.serve.replies import ReplyHeader
from app.serve.running import reply_unless_gone, shutting_down, submit
from app.serve.schemas import ChatCompletionRequest
from app.serve.state import ServerState
from mlxcore import RequestHandle
from mlxcore import Request

CLIENT_GONE = 499  # nginx's status for a client that closed the connection first (nothing is sent)


@dataclass(eq=False)
class Exchange:
    """See the module docstring."""

    header: ReplyHeader
    served: ServedModel  # the model that answers (its tokenizer spells the reply's logprobs)
    handles: list[RequestHandle]
    choices: list[ChoiceState]
    prompt_tokens: int
    user: str | None = None
    started: float = field(default_factory=time.perf_counter)  # before submitting: the TTFT includes the queue

    @classmethod
    def open(cls, state: ServerState, served: ServedModel, request: Request, *, kind: str, n: int, split: bool,
             user: str | None, tools: list[dict] | None = None) -> Exchange:
        """Submit ``request`` to ``served`` (inside ``state.models.use``: the lease ends once it is submitted)."""
        if state.stopping.is_set():  # a kept-alive connection's request after SIGTERM
            raise shutting_down()
        started = time.perf_counter()
        handles = submit(served.worker, request, n)
        stops = request.params.stop
        choices = [ChoiceState(i, split, stops, tools=tools) for i in range(n)]
        exchange = cls(ReplyHeader(kind, served.info.id), served, handles, choices, len(request.prompt_ids), user,
                       started)
        state.models.sending(served, exchange)
        return exchange

    def usage(self) -> dict:
        return usage(self.choices, self.prompt_tokens)

    def ttft(self) -> float | None:
        """Seconds from the request to its first token (of any choice), as sent; None if none came."""
        firsts = [choice.arrivals[0] for choice in self.choices if choice.arrivals]
        return min(firsts) - self.started if firsts else None

    async def wait(self, state: ServerState, request: HTTPRequest) -> bool:
        """Follow every choice to its end; False (all cancelled) if the client left first. A reply cut by
        the server's shutdown is an error (503), not a partial reply."""
        outcome = "client gone"
        try:
            done = await reply_unless_gone(request, self.handles, self.choices)
            outcome = None if done else outcome
            if done and state.stopping.is_set() and any(c.finish_reason == "cancelled" for c in self.choices):
                raise shutting_down()
            return done
        except APIError as error:  # the engine refused the request, or failed while it ran
            outcome = f"error {error.status}"
            raise
        finally:
            self.finish(state, request.scope.setdefault("state", {}), outcome)

    def finish(self, state: ServerState, scope_state: dict, outcome: str | None = None) -> None:
        """Record latencies and the log summary; ``outcome`` overrides the finish reasons ("client gone")."""
        state.models.sent(self.served, self)
        first = self.ttft()
        state.metrics.observe_reply(first, self.choices)
        used = self.usage()
        reasons = outcome or ",".join(str(c.finish_reason) for c in self.choices)
        ttft = f"{first:.3f}s" if first is not None else "-"
        prompt, cached = used["prompt_tokens"], used["prompt_tokens_details"]["cached_tokens"]
        scope_state["summary"] = (f"prompt={prompt} cached={cached} completion={used['completion_tokens']} "
                                  f"ttft={ttft} finish={reasons}" + (f" user={self.user!r}" if self.user else ""))


async def open_chat(state: ServerState, body: ChatCompletionRequest) -> tuple[Exchange, bool]:
    """``body`` checked, built with the model's chat template and submitted; and whether the model thinks first."""
    thinking = body.thinking(state.settings.thinking)
    async with state.models.use(body.model, body.keep_alive_seconds) as served:
        scheduled = await chat_request(body, served.tokens, served.info, thinking=thinking,
                                       system=state.settings.system)
        return Exchange.open(state, served, scheduled, kind="chat", n=body.n, split=True, user=body.user,
                             tools=body.offered_tools), thinking

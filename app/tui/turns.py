"""The turn on screen: a reply streaming, or replies side by side waiting for the user to keep one.

The engine numbers every turn and says, with each Conversation, which one the
chat on screen has (0: none) and what its replies have so far. When that number
changes, the window leaves the turn it showed (a chat that went on answering in
the background takes its reply with it) and shows the new one as far as it got.
"""

from __future__ import annotations

from app.engine_host import protocol as p
from app.tui.host import ChatHost
from app.tui.widgets.alternatives import AlternativesView


class TurnView(ChatHost):
    """Mixed into ChatApp; uses its chat, status, prompt, client, state, collector, generating and pending_reply."""

    turn = 0  # the engine's number of the turn on screen; 0 when there is none
    alternatives_count = 2  # replies f7 asks for (settings, f10)

    @property
    def picking(self) -> int:
        """How many replies side by side wait for the user to keep one (0: none)."""
        view = self.chat.alternatives
        return len(view.columns) if view is not None and view.all_ended and not view.picked else 0

    async def _show_turn(self, event: p.Conversation) -> None:
        """Show ``event``'s chat: leave the turn shown before if it is another, then show its own."""
        changed = event.turn != self.turn
        if changed and self.turn:
            await self._leave_turn()
        await self.chat.sync(list(event.messages))
        if changed:
            self.turn = event.turn
            if event.turn:
                await self._enter_turn(event.replies)

    async def _leave_turn(self) -> None:
        live, view = self.chat.live, self.chat.alternatives
        if live is not None and live.streaming:  # the chat went on answering in the background
            await self.chat.drop_live()
        if view is not None:
            focused = view.has_focus_within
            await self.chat.remove_alternatives()
            if focused:
                self.prompt.focus()
        self.pending_reply = None
        if self.generating:
            self.generating = False
            self.collector.release()
            self.status.show_idle()

    async def _enter_turn(self, replies: tuple[p.ReplySoFar, ...]) -> None:
        """A turn in progress comes on screen (just started, or its chat was opened again)."""
        running = any(not reply.ended for reply in replies)
        if len(replies) == 1:
            self.pending_reply = replies[0].raw
            await self.chat.start_reply(replies[0].raw)
        else:
            view = await self.chat.show_alternatives(replies)
            view.focus()  # keys 1-n keep a reply
        if running and not self.generating:
            self.collector.hold()
            self.status.generating_started(len(replies))
        self.generating = running
        if not running:
            self.status.picking(len(replies))

    # events ---------------------------------------------------------------------------------

    async def _engine_chunk(self, event: p.Chunk) -> None:
        view = self.chat.alternatives
        if view is not None:
            await view.stream(event.choice, event.thinking, event.answer)
        else:
            self.pending_reply = (self.pending_reply or "") + event.raw
            await self.chat.stream(event.thinking, event.answer)
        self.status.generating_progress(event.pieces)

    async def _engine_choiceended(self, event: p.ChoiceEnded) -> None:
        view = self.chat.alternatives
        if view is None:
            return
        await view.end(event.choice, event.finish_reason)
        if view.all_ended and self.generating:
            self.generating = False
            self.status.picking(len(view.columns))
            self.call_after_refresh(self.collector.release)

    # the user's intents -----------------------------------------------------------------------

    async def action_alternatives(self) -> None:
        """n replies to the message typed, or in place of the last reply when nothing is typed."""
        if self._busy() or not self.state:
            return
        n = self.alternatives_count
        if not self.prompt.text.strip() and (not self.state.messages or self.state.messages[-1][0] != "assistant"):
            self.notify("Type a message first: f7 answers it with several replies side by side.", severity="warning")
            return
        if self.state.params.get("temperature") == 0:
            self.notify("At temperature 0 the replies are all the same: raise it in the settings (ctrl+y, f10).",
                        severity="warning")
        text = self.prompt.take()
        if text is None:
            self._generate(p.Regenerate(n), n)
            return
        await self.chat.sync(self.chat.records + [("user", text)])
        self._generate(p.Send(text, n), n)

    def action_pick(self, number: int) -> None:
        """Keep reply ``number`` (from 1) of the replies side by side."""
        view = self.chat.alternatives
        if view is None:
            self.notify("There are no replies side by side to keep.", severity="warning")
            return
        view.action_pick(number)

    def on_alternatives_view_picked(self, event: AlternativesView.Picked) -> None:
        if self._engine_running():
            self.client.send(p.Pick(event.choice))

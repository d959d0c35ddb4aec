"""The engine host's models: the engine in use and the batching scheduler every chat's replies run on."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from app.engine_host import protocol as p
from app.engine_host.channel import SendEvent
from mlxcore import MlxchatError

if TYPE_CHECKING:
    from mlxcore import Engine, GenerationParams, OpenedEngine
    from mlxcore import LocalBatch
    from sessions import ChatSession, Message

PROGRESS_EVERY_S = 0.1  # download progress


class ModelHolder:
    """The opened engine (None until the first Open has loaded it) and its scheduler (None when its caches do
    not batch, ``Engine.batches``: replies then run one at a time)."""

    def __init__(self, send: SendEvent) -> None:
        self.send = send
        self.opened: OpenedEngine | None = None
        self.batch: LocalBatch | None = None

    @property
    def engine(self) -> Engine:
        if self.opened is None:
            raise MlxchatError("No model is loaded yet: wait for it.")
        return self.opened.engine

    def load(self, command: p.Open) -> OpenedEngine:
        """Load the models ``command`` names (downloading them if need be, with progress); the ones in use stay
        until ``use``."""
        from mlxcore import KVConfig, ModelChoice, open_engine
        from mlxcore import release_models

        kv = KVConfig(kind=command.kv, max_kv=command.max_kv, block_size=command.block_size,
                      max_kv_bytes=command.max_kv_bytes, kv_bits=command.kv_bits,
                      disk_kv_bytes=command.disk_kv_bytes, disk_kv_dir=command.disk_kv_dir)
        choice = ModelChoice(model=command.model, draft=command.draft, no_draft=command.no_draft)
        release_models()  # what the model in use left cached goes back before the new one's weights arrive
        return open_engine(choice, kv, progress=DownloadProgress(self.send).report, num_draft=command.num_draft,
                           notice=lambda text: self.send(p.Notice(text[0].upper() + text[1:])))

    def use(self, opened: OpenedEngine) -> None:
        """Answer with ``opened`` from now on, on a scheduler of its own."""
        self.opened = opened
        self.batch = None
        if opened.engine.batches:
            from mlxcore import LocalBatch
            self.batch = LocalBatch(opened.engine)

    def step(self) -> None:
        """One scheduler step. A step that raises fails its requests with the error (what they generated
        stays; their caches go back to the pool), and a new scheduler takes over."""
        batch = self.batch
        if batch is None or not batch.busy:
            return
        try:
            batch.step()
        except Exception as error:  # noqa: BLE001  the engine failed mid-step: every turn ends with the error
            from mlxcore import LocalBatch
            batch.runner.fail_all(error)
            self.batch = LocalBatch(self.engine)

    def new_session(self, system: str | None, params: GenerationParams, think: bool,
                    messages: Sequence[Message] | None = None, title: str | None = None) -> ChatSession:
        """A ChatSession on the engine in use (``messages``: start from this history)."""
        from sessions import ChatSession
        session = ChatSession(self.engine, system, params, enable_thinking=think)
        if messages is not None:  # the system prompt given wins over one in the messages
            rest = [m for m in messages if m.role != "system"]
            session.messages = (session.messages[:1] if system else []) + rest
        session.title = title
        return session


class DownloadProgress:
    """Tells the UI how far a download is, a few times a second (and when it is done)."""

    def __init__(self, send: SendEvent) -> None:
        self.send, self.last = send, 0.0

    def report(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S or done >= total:
            self.last = now
            self.send(p.Progress(done, total))

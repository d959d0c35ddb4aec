"""Saves, deletes and garbage collection on one session store from another process (tests/test_store_gc.py).

``python tests/store_gc_helper.py grow STORE SEED N`` saves one chat through the states
0..N-1 of ``chat_state`` (each adds tokens; its old tail block becomes garbage), printing
``saved I missing M`` after each save: M blocks some chat refers to are not on disk.

``python tests/store_gc_helper.py shadow STORE SEED N`` saves, for I in 0..N-1, state
I + 1 of the same chat as a *new* chat, deletes it (which collects garbage) and collects
once more, printing ``shadowed I missing M``. So the blocks the growing chat's next save needs are
on disk, about to be deleted, while that save looks for them: the race GC must win safely.

Both wait for a line on stdin before they start, so that a test starts them together.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from session_kill_helper import tiny_engine  # noqa: E402  (imports mlxcore before mlx)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlxcore.engine import Engine  # noqa: E402
from mlxcore.kv.base import ModelCache  # noqa: E402
from sessions.chat_session import ChatSession  # noqa: E402
from sessions.messages import Message  # noqa: E402
from sessions.block_files import BlockFiles  # noqa: E402
from sessions.store import SessionStore  # noqa: E402
from sessions.store_gc import BlockLock  # noqa: E402
from sessions.store_index import StoreIndex  # noqa: E402

FIRST, STEP = 40, 23  # tokens of state 0, tokens each later state adds
VOCAB = 2048


def engine() -> Engine:
    """The engine every process opens these chats with (standard cache, no draft)."""
    return tiny_engine("standard", draft=False)


def chat_state(engine: Engine, seed: int, n: int) -> ChatSession:
    """State ``n`` of the chat ``seed``: the same tokens and cache values in every process."""
    length, g = FIRST + STEP * n, engine.new_caches().target.geometry
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, VOCAB, FIRST + STEP * 200)[:length].tolist()
    shape = (1, g.kv_heads, length, g.head_dim)
    tensors = {}
    for layer in range(g.num_layers):
        for name in ("keys", "values"):
            values = np.random.RandomState([seed, layer, name == "keys"]).standard_normal((1, g.kv_heads, 4096,
                                                                                          g.head_dim))
            tensors[f"{layer}.{name}"] = mx.array(values[:, :, :length].astype(np.float32)).reshape(shape)
    session = ChatSession(engine, "system prompt")
    session.messages += [m for i in range(n + 1) for m in (Message("user", f"turn {i}"),
                                                              Message("assistant", f"reply {i}"))]
    session.caches.target = ModelCache.from_state(engine.model, tensors, {"kind": "standard", "tokens": tokens})
    session.caches.ids = list(tokens)
    return session


def missing_blocks(root: Path) -> int:
    """Blocks some chat refers to that are not on disk: always 0, whatever another process is doing.

    Looked at with the block lock shared, as a save or a read holds it: no GC runs meanwhile.
    """
    with BlockLock(root).shared():
        return len(StoreIndex(root).referenced() - set(BlockFiles(root).keys()))


def grow(store: SessionStore, seed: int, count: int) -> None:
    chat_id, on = None, engine()
    for n in range(count):
        chat_id = store.save(chat_state(on, seed, n), chat_id).id
        print(f"saved {n} missing {missing_blocks(store.root)}", flush=True)


def shadow(store: SessionStore, seed: int, count: int) -> None:
    on = engine()
    for n in range(count):
        store.delete(store.save(chat_state(on, seed, n + 1)).id)
        store.collect_garbage()
        print(f"shadowed {n} missing {missing_blocks(store.root)}", flush=True)


if __name__ == "__main__":
    action, root, seed, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    sys.stdin.readline()
    {"grow": grow, "shadow": shadow}[action](SessionStore(root), seed, count)

"""Content addresses of stored KV blocks: a chained hash of the tokens, salted with what the KV means.

A block holds the keys and values of ``BLOCK_TOKENS`` consecutive tokens (the last
block of a cache may hold fewer). Its key chains the previous block's key with its
own token ids, like the paged cache's prefix hash, so two caches share a stored
block exactly when they hold the same tokens from position 0 up to its end. The
chain starts from a *salt* naming the model's fingerprint, the role (target or
draft), the tensor layout (names, dtypes, per-token shapes) and the KV format
(float, or quantized as "q8g32"...): blocks of other models, roles, dtypes or KV
formats can never collide, even for the same tokens, so a float chat and an 8-bit
chat of the same tokens share no block.

A rotating window's slots depend on evictions, not on a token prefix, so its state
is stored whole under ``window_key``: a hash of the salt and of the bytes themselves.

Pure Python (no MLX): the chat window's process checks keys too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from mlxcore import token_bytes, tokens_from

__all__ = ["BLOCK_TOKENS", "BlockRef", "chain_keys", "layout_salt", "token_bytes", "tokens_from", "window_key"]

BLOCK_TOKENS = 16  # the paged cache's default block size: an autosave rewrites at most one partial block
STORAGE_VERSION = 1  # part of every salt: a change of the block encoding starts new keys
_DIGEST = 20  # bytes of blake2b: 160 bits, collisions out of reach for any store


@dataclass(frozen=True)
class BlockRef:
    """One stored block of a cache: its key and the tokens it covers (positions ``start`` to ``end``)."""

    key: str  # hex
    start: int
    end: int


def layout_salt(fingerprint: str, role: str, family: str, layout: dict[str, tuple[str, tuple[int, ...]]],
                kv_format: str = "float") -> bytes:
    """The chain's start for one model's cache.

    ``family``: "positional" (standard and paged caches: token i at position i) or
    "window" (rotating). ``layout``: tensor name -> (dtype name, shape with the token
    axis as -1), e.g. {"0.keys": ("F32", (1, 2, -1, 32)), ...}. ``kv_format``:
    ``KVFormat.name`` ("float", "q8g32", ...).
    """
    described = {"storage": STORAGE_VERSION, "model": fingerprint, "role": role, "family": family,
                 "layout": {name: [dtype, list(shape)] for name, (dtype, shape) in sorted(layout.items())}}
    if kv_format != "float":  # float salts stay as before quantized formats existed: stores keep their keys
        described["kv_format"] = kv_format
    text = json.dumps(described, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=_DIGEST).digest()


def chain_keys(salt: bytes, tokens: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> list[BlockRef]:
    """The blocks of a positional cache holding ``tokens``: full ones, then a partial last one if any."""
    refs, parent = [], salt
    for start in range(0, len(tokens), block_tokens):
        end = min(start + block_tokens, len(tokens))
        digest = hashlib.blake2b(parent, digest_size=_DIGEST)
        digest.update(token_bytes(tokens[start:end]))
        parent = digest.digest()
        refs.append(BlockRef(parent.hex(), start, end))
    return refs


def window_key(salt: bytes, payload: bytes) -> str:
    """The key of a rotating window's whole state: its salt and its bytes."""
    digest = hashlib.blake2b(salt, digest_size=_DIGEST)
    digest.update(b"window")
    digest.update(hashlib.sha256(payload).digest())
    return digest.hexdigest()

"""The one on-disk form of a KV block, shared by the session store (``sessions/block_files.py``) and the
pool's disk tier (``disk_tier.py``): a frame with a checksum around a payload of token ids and tensor slices.

Frame::

    magic     16 bytes  b"MLXCHAT-KVBLOCK\\n"
    length     8 bytes  u64 little-endian, the payload's size
    payload    ...      see below
    sha256    32 bytes  of every byte before it

Payload: the number of tokens (u32), their ids (u32 each), then each state tensor's slice for those tokens,
in the order of the tensors' names, raw little-endian, shaped (1, kv_heads, n, width) (``sessions/kv_blocks.py``
names them "<layer>.keys", "<layer>.values", and a quantized cache's ".scales" and ".biases").

Pure Python (no MLX): the chat window's process reads frames too.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence

MAGIC = b"MLXCHAT-KVBLOCK\n"
_HEAD = len(MAGIC) + 8
_DIGEST = 32


def frame_block(payload: bytes) -> bytes:
    """``payload`` framed: magic, length, the payload, its checksum."""
    data = MAGIC + struct.pack("<Q", len(payload)) + payload
    return data + hashlib.sha256(data).digest()


def unframe_block(data: bytes) -> bytes | None:
    """The payload of a frame, or None if ``data`` is not one whole, unchanged frame."""
    length = struct.unpack("<Q", data[len(MAGIC):_HEAD])[0] if len(data) >= _HEAD else -1
    if not data.startswith(MAGIC) or len(data) != _HEAD + length + _DIGEST or \
            hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
        return None
    return data[_HEAD:-_DIGEST]


def block_payload(tokens: Sequence[int], parts: Iterable[bytes]) -> bytes:
    """A block's payload: its token count and ids, then its tensors' bytes (in name order)."""
    return b"".join([struct.pack("<I", len(tokens)), token_bytes(tokens), *parts])


def block_tokens(data: bytes) -> tuple[list[int], int] | None:
    """A payload's token ids and where its tensors start; None if it is too short to hold them."""
    if len(data) < 4:
        return None
    count = struct.unpack("<I", data[:4])[0]
    end = 4 + 4 * count
    if len(data) < end:
        return None
    return tokens_from(data[4:end]), end


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian unsigned 32-bit words (how blocks and the store's index hold them)."""
    return array("I", tokens).tobytes()


def tokens_from(data: bytes) -> list[int]:
    """The inverse of ``token_bytes``; ``ValueError`` if ``data`` is not whole words."""
    if len(data) % 4:
        raise ValueError("token data is not whole 32-bit words")
    words = array("I")
    words.frombytes(data)
    return words.tolist()


# array's words are the machine's: little-endian wherever MLX runs (x86-64, arm64)
assert sys.byteorder == "little" and array("I").itemsize == 4, "token ids are stored as little-endian 32-bit words"

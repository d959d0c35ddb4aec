"""Tensors <-> the bytes of a safetensors file, written and read here with full validation.

Own reader and writer (the format is an 8-byte length, a JSON index and raw
little-endian data) so that bfloat16 caches round-trip through numpy as raw
16-bit words (a quantized cache's uint32 words as they are), and so that a
malformed payload gives a ``SessionFileError`` saying what is wrong rather than
whatever a parser happens to raise.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from typing import TypeGuard

import mlx.core as mx
import numpy as np

from sessions.errors import SessionFileError

MAX_INDEX_BYTES = 16 * 1024 * 1024
MAX_DIM = 2**31 - 1  # MLX shapes are 32-bit
MAX_NDIM = 8

Word = np.float32 | np.float16 | np.uint16 | np.uint32  # a numpy word of DTYPES below
Words = np.ndarray[tuple[int, ...], np.dtype[Word]]  # a tensor as its raw little-endian words (``raw_words``)
# safetensors dtype name -> (numpy dtype of the raw words, MLX dtype)
DTYPES: dict[str, tuple[np.dtype[Word], mx.Dtype]] = {
    "F32": (np.dtype("<f4"), mx.float32),
    "F16": (np.dtype("<f2"), mx.float16),
    "BF16": (np.dtype("<u2"), mx.bfloat16),  # numpy has no bfloat16: keep the raw words
    "U32": (np.dtype("<u4"), mx.uint32),  # a quantized cache's packed words (saved_kv.py)
}
FLOAT_DTYPES = ("F32", "F16", "BF16")  # what a model's KV (and a quantized cache's scales and biases) may be
_NAMES = {mlx_dtype: name for name, (_, mlx_dtype) in DTYPES.items()}


def dtype_name(dtype: mx.Dtype) -> str:
    """The safetensors name of an MLX dtype ("F32", "F16", "BF16", "U32"); ``SessionFileError`` for others."""
    if dtype not in _NAMES:
        raise SessionFileError(f"Cannot save a KV cache of dtype {dtype}: only float32, float16 and bfloat16 "
                               "(and uint32 for quantized words).")
    return _NAMES[dtype]


def encode_tensors(tensors: dict[str, mx.array]) -> Iterator[bytes]:
    """The safetensors bytes of ``tensors``, piece by piece (one tensor in memory at a time)."""
    index: dict[str, dict[str, object]] = {}
    offset = 0
    for name in sorted(tensors):
        array = tensors[name]
        kind = dtype_name(array.dtype)
        size = array.size * DTYPES[kind][0].itemsize
        index[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(index, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format aligns the data to 8 bytes
    yield struct.pack("<Q", len(text))
    yield text
    for name in sorted(tensors):
        yield _raw_bytes(tensors[name])


def raw_words(array: mx.array) -> Words:
    """``array`` as contiguous little-endian numpy words (bfloat16 as its raw 16-bit words)."""
    kind = dtype_name(array.dtype)
    raw = array.view(mx.uint16) if kind == "BF16" else array
    return np.ascontiguousarray(np.array(raw), dtype=DTYPES[kind][0])


def from_words(words: Words, kind: str) -> mx.array:
    """The inverse of ``raw_words`` for the safetensors dtype name ``kind``."""
    array = mx.array(words)
    return array.view(DTYPES[kind][1]) if kind == "BF16" else array


def _raw_bytes(array: mx.array) -> bytes:
    return raw_words(array).tobytes()


def decode_tensors(payload: bytes, where: str) -> dict[str, mx.array]:
    """The tensors of a safetensors payload; ``SessionFileError`` naming ``where`` if malformed."""
    if len(payload) < 8:
        raise SessionFileError(f"{where}: the tensor data is truncated.")
    (length,) = struct.unpack("<Q", payload[:8])
    if length > MAX_INDEX_BYTES or 8 + length > len(payload):
        raise SessionFileError(f"{where}: the tensor index declares {length:,} bytes, which do not fit.")
    try:
        index = json.loads(payload[8:8 + length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SessionFileError(f"{where}: the tensor index is not valid JSON.") from None
    if not isinstance(index, dict):
        raise SessionFileError(f"{where}: the tensor index is not a JSON object.")
    index.pop("__metadata__", None)
    data = memoryview(payload)[8 + length:]
    entries = {name: _entry(name, spec, where) for name, spec in index.items()}
    _check_layout(entries, len(data), where)
    return {name: _array(data, *entry) for name, entry in entries.items()}


def _entry(name: str, spec: object, where: str) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype name, shape, start, end) of one index entry, checked."""
    bad = f"{where}: tensor {name!r} is described wrongly in the index"
    kind = spec.get("dtype") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(kind, str) or kind not in DTYPES:
        raise SessionFileError(f"{bad} (dtype {kind if isinstance(spec, dict) else spec!r}).")
    shape, offsets = spec.get("shape"), spec.get("data_offsets")
    if not (isinstance(shape, list) and len(shape) <= MAX_NDIM and all(_is_int(d, MAX_DIM) for d in shape)):
        raise SessionFileError(f"{bad} (shape {shape!r}).")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o, 2**63) for o in offsets)):
        raise SessionFileError(f"{bad} (data offsets {offsets!r}).")
    start, end = offsets
    if end - start != math.prod(shape) * DTYPES[kind][0].itemsize:
        raise SessionFileError(f"{bad}: its byte range does not fit its shape and dtype.")
    return kind, tuple(shape), start, end


def _check_layout(entries: dict[str, tuple[str, tuple[int, ...], int, int]], size: int, where: str) -> None:
    """The byte ranges must tile the data exactly: no gaps, no overlaps, nothing left over."""
    position = 0
    for _, _, start, end in sorted(entries.values(), key=lambda e: (e[2], e[3])):
        if start != position:
            raise SessionFileError(f"{where}: the tensor data has gaps or overlaps.")
        position = end
    if position != size:
        raise SessionFileError(f"{where}: the tensor data is {size:,} bytes, the index describes {position:,}.")


def _array(data: memoryview, kind: str, shape: tuple[int, ...], start: int, end: int) -> mx.array:
    return from_words(np.frombuffer(data[start:end], dtype=DTYPES[kind][0]).reshape(shape), kind)


def _is_int(value: object, limit: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit

"""How a saved cache's keys and values are laid out, per KV format: the tensors a header promises.

A float cache saves, per layer, ``keys`` and ``values``, each (1, kv_heads, T, head_dim)
in the model's dtype. A quantized one (``mlxcore/kv/kv_format.py``) saves its blocks as
the pool stores them, never dequantized: per layer ``keys`` (uint32 words, 32 / bits
numbers each: (1, kv_heads, T, head_dim * bits / 32)), ``keys.scales`` and
``keys.biases`` ((1, kv_heads, T, head_dim / group_size), the model's dtype), and the
same three for ``values``. Headers name the format as ``KVFormat.name`` does: "float",
"q8g32", ...; a header without one (session format 1) is float.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mlxcore import SUPPORTED_BITS, KVFormat, KVFormatError, kv_format
from mlxcore import tensor_names as stored_names
from sessions.errors import SessionFileError

if TYPE_CHECKING:
    from mlxcore import CacheMeta

FLOAT = KVFormat()
FORMAT_KEYS = ("kv_format", "kv_bits", "group_size")  # how ``state_dict`` metadata names the format
_QUANTIZED_NAME = re.compile(r"q([0-9]{1,2})g([0-9]{1,4})")


def layer_tensors(fmt: KVFormat, dtype: str, kv_heads: int, head_dim: int,
                  length: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (safetensors dtype, shape) of one layer's saved tensors holding ``length`` tokens."""
    if fmt.bits is None:  # float
        return {name: (dtype, (1, kv_heads, length, head_dim)) for name in stored_names(fmt)}
    words = (1, kv_heads, length, head_dim * fmt.bits // 32)
    groups = (1, kv_heads, length, head_dim // fmt.group_size)
    return {name: ("U32", words) if name in ("keys", "values") else (dtype, groups) for name in stored_names(fmt)}


def read_format(value: object, head_dim: int, where: str) -> KVFormat:
    """The KV format a header names (``value``: "float", "q8g32", ...), checked against the head size.

    ``SessionFileError`` for a name that is no format, bits this mlxchat cannot read, or a group
    size other than the one it quantizes these heads with (``PagedCache`` restores those only).
    """
    if value == FLOAT.name:
        return FLOAT
    match = _QUANTIZED_NAME.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise SessionFileError(f"{where} names the KV format {value!r}, which is not one: the header is damaged.")
    named = KVFormat(int(match[1]), int(match[2]))
    if named.bits not in SUPPORTED_BITS:
        raise SessionFileError(f"{where} is stored as {describe(named)}, which this mlxchat cannot read: "
                               "update mlxchat to open it with its cache.")
    try:
        expected = kv_format(named.bits, head_dim)
    except KVFormatError as error:
        raise SessionFileError(f"{where} names the KV format {named.name} for heads of {head_dim}: the header "
                               f"is damaged ({error})") from None
    if expected != named:
        raise SessionFileError(f"{where} is stored as {named.name} (groups of {named.group_size}); this mlxchat "
                               f"stores heads of {head_dim} as {expected.name} and cannot read it: the file is "
                               "damaged or from a newer mlxchat.")
    return named


def meta_fields(fmt: KVFormat) -> CacheMeta:
    """The format as ``state_dict`` metadata names it (``FORMAT_KEYS``: what ``ModelCache.from_state`` reads)."""
    return {"kv_format": fmt.name, "kv_bits": fmt.bits, "group_size": fmt.group_size}


def format_of(meta: CacheMeta) -> KVFormat:
    """The format of a ``state_dict``'s metadata (kinds that only store floats name none)."""
    bits = meta.get("kv_bits")
    if bits is None:
        return FLOAT
    group_size = meta["group_size"]
    assert group_size is not None, "a quantized cache's metadata names its group size"
    return KVFormat(int(bits), int(group_size))


def describe(fmt: KVFormat) -> str:
    """The format in words, for messages: "a float KV cache", "an 8-bit KV cache (q8g32)"."""
    if not fmt.quantized:
        return "a float KV cache"
    article = "an" if fmt.bits in (8, 11, 18) else "a"  # said aloud: "an eight-bit", "a four-bit"
    return f"{article} {fmt.bits}-bit KV cache ({fmt.name})"

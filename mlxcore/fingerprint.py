"""A model folder's fingerprint: a short hash that session files record.

It covers what decides the tokens a model produces: config.json, the weights
index (file names, sizes, safetensors headers and a few sampled bytes of each
file), the tokenizer and the chat template. It reads kilobytes, not gigabytes,
and is the same in every process and on every machine for the same files.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from mlxcore.errors import ModelLoadError

SCHEME = b"mlxchat-fingerprint-v1"  # bump when what is hashed changes
WEIGHTS_GLOB = "model*.safetensors"  # the files mlx-lm's load_model reads
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
SAMPLE_BYTES = 4096  # per sample; three samples per weights file
MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit


def model_fingerprint(folder: Path) -> str:
    """The fingerprint (16 hex digits of a sha256) of the model in ``folder``.
    Raises ModelLoadError when config.json or a weights file cannot be read."""
    digest = hashlib.sha256(SCHEME)
    _add(digest, "config.json", canonical_json(read_config(folder)))
    for path in weight_files(folder):
        _add(digest, path.name, _weights_summary(path))
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            _add(digest, name, (folder / name).read_bytes())
    return digest.hexdigest()[:16]


def read_config(folder: Path) -> dict:
    """config.json of ``folder`` as a dict; ModelLoadError if it is missing or not a JSON object."""
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no config.json: it is not a model folder in the MLX layout.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"{path} is not valid JSON ({one_line(error)}); "
                             "restore it or download the model again.") from error
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} holds a JSON {type(config).__name__}, not an object; "
                             "restore it or download the model again.")
    return config


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files mlx-lm loads from ``folder``, sorted; ModelLoadError if there are none."""
    files = sorted(folder.glob(WEIGHTS_GLOB))
    if not files:
        raise ModelLoadError(f"{folder} has no weights ({WEIGHTS_GLOB}); "
                             "download the model again or point at the right folder.")
    return files


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file, checked against the file's size.
    Raises ModelLoadError for a file that is not safetensors or is truncated."""
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
        if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
            raise _corrupt(path, "its header length is impossible")
        try:
            header = json.loads(file.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise _corrupt(path, "its header is not JSON") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "its header is not a JSON object")
    try:
        end = max((int(entry["data_offsets"][1]) for key, entry in header.items()
                   if key != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise _corrupt(path, "its header is malformed") from None
    if 8 + length + end > size:
        raise _corrupt(path, "it is truncated")
    return header


def canonical_json(value: object) -> bytes:
    """``value`` as JSON with sorted keys and no spaces: the same bytes for equal values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def one_line(error: BaseException) -> str:
    """An exception's message squeezed onto one line, for user-facing errors."""
    return " ".join(str(error).split()) or type(error).__name__


def _weights_summary(path: Path) -> bytes:
    """Size, header and three sampled slices: cheap, yet different for retrained weights."""
    header = safetensors_header(path)
    size = path.stat().st_size
    parts = [str(size).encode(), canonical_json(header)]
    with path.open("rb") as file:
        for offset in (0, size // 2, max(size - SAMPLE_BYTES, 0)):
            file.seek(offset)
            parts.append(file.read(SAMPLE_BYTES))
    return b"\0".join(parts)


def _add(digest: hashlib._Hash, name: str, payload: bytes) -> None:
    # Length-prefixed so that moving bytes between fields changes the hash.
    for part in (name.encode(), payload):
        digest.update(struct.pack("<Q", len(part)))
        digest.update(part)


def _corrupt(path: Path, why: str) -> ModelLoadError:
    return ModelLoadError(f"{path} is not a usable safetensors file ({why}); "
                          "download the model again.")

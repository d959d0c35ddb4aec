"""Damaged, truncated and inconsistent 8-bit session files: each refused with a SessionFileError saying why.

The same checks as for float files (tests/test_session_file.py), on the quantized layout: packed
uint32 words, scales and biases per cache, and the KV format the header names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from session_file_forms import save_whole
from test_session_kv8 import chat, engine

import mlxcore  # noqa: F401  (optimized BLAS before mlx)
import mlx.core as mx
from sessions.errors import SessionFileError
from sessions.file_format import encode_header, read_file, write_file
from sessions.safetensors_payload import decode_tensors, encode_tensors
from sessions.chat_session import ChatSession


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> tuple[bytes, object]:
    """The bytes of a valid 8-bit file (embedded pair, paged, one turn) and an 8-bit engine that opens it.

    A whole file of format 2, as earlier mlxchats wrote (its safetensors payload is what these tests
    change); the appending layout's own damage is in tests/test_session_file_log.py."""
    path = tmp_path_factory.mktemp("valid") / "chat.mlxchat"
    save_whole(chat(engine(), ("Hello there, how are you today?",)), path)
    return path.read_bytes(), engine()


def assert_rejected(path: Path, made, match: str) -> None:
    before = path.read_bytes()
    with pytest.raises(SessionFileError, match=match):
        ChatSession.load(path, made)
    assert path.read_bytes() == before, "a refused file is left as it was"


def resealed(tmp_path: Path, data: bytes, change_header=None, change_tensors=None) -> Path:
    """A copy of ``data`` with its header or tensors changed and its checksums made valid again."""
    source = tmp_path / "source.mlxchat"
    source.write_bytes(data)
    header, payload = read_file(source)
    if change_header:
        change_header(header)
    if change_tensors:
        tensors = decode_tensors(payload, "source")
        change_tensors(tensors)
        payload = b"".join(encode_tensors(tensors))
    path = tmp_path / "changed.mlxchat"
    write_file(path, encode_header(header), [payload])
    return path


def test_the_valid_file_is_quantized_and_opens(valid, tmp_path):
    path = tmp_path / "ok.mlxchat"
    path.write_bytes(valid[0])
    assert ChatSession.load(path, valid[1]).caches.target.geometry.format.name == "q8g32"


@pytest.mark.parametrize("keep", [56, 300, 0.5, 0.9, -200, -33, -1])
def test_truncated_file(valid, tmp_path, keep):
    data, made = valid
    path = tmp_path / "t.mlxchat"
    path.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    assert_rejected(path, made, "truncated|damaged")


@pytest.mark.parametrize("where", [0.3, 0.6, 0.95, -100])
def test_bit_flip_in_the_quantized_tensors(valid, tmp_path, where):
    data, made = valid
    at = int(len(data) * where) if isinstance(where, float) else where % len(data)
    path = tmp_path / "f.mlxchat"
    path.write_bytes(data[:at] + bytes([data[at] ^ 0x04]) + data[at + 1:])
    assert_rejected(path, made, "damaged")


def _cache(role: str, **change):
    return lambda h: h["cache"][role].update(change)


BAD_HEADERS = {
    "format said float": (_cache("target", kv_format="float"), "tensor 'target.0.keys' is U32 .* says F32"),
    "other groups": (_cache("draft", kv_format="q8g64"), r"q8g64 \(groups of 64\); .* heads of 32 as q8g32"),
    "heads it cannot take": (_cache("draft", head_dim=48), "q8g32 for heads of 48: the header is damaged"),
    "bits unknown here": (_cache("target", kv_format="q4g32"), "4-bit KV cache .* cannot read"),
    "not a format": (_cache("target", kv_format="q8"), "KV format 'q8', which is not one"),
    "not text": (_cache("target", kv_format=8), "KV format 8, which is not one"),
    "version 1": (lambda h: h.update(version=1), "format 1 holds float caches only"),
    "token count": (lambda h: h["cache"]["target"]["tokens"].pop(), "tensor 'target.0.keys' is U32"),
    "scales dtype": (_cache("target", dtype="F16"), "'target.0.keys.biases' is F32 .* says F16"),
}


@pytest.mark.parametrize("name", BAD_HEADERS)
def test_inconsistent_header(valid, tmp_path, name):
    change, match = BAD_HEADERS[name]
    assert_rejected(resealed(tmp_path, valid[0], change), valid[1], match)


BAD_TENSORS = {
    "biases missing": (lambda t: t.pop("target.2.values.biases"), "'target.2.values.biases' is missing"),
    "scales as float16": (lambda t: t.update({"draft.0.keys.scales": t["draft.0.keys.scales"].astype(mx.float16)}),
                          "'draft.0.keys.scales' is F16"),
    "words narrower": (lambda t: t.update({"target.1.keys": t["target.1.keys"][..., :4]}),
                       r"'target.1.keys' is U32 \(1, 2, \d+, 4\), the header says U32 \(1, 2, \d+, 8\)"),
    "words as floats": (lambda t: t.update({"target.0.values": t["target.0.values"].view(mx.float32)}),
                        "'target.0.values' is F32"),
    "one more": (lambda t: t.update({"target.0.keys.zeros": t["target.0.keys.scales"]}), "unexpected tensor"),
}


@pytest.mark.parametrize("name", BAD_TENSORS)
def test_inconsistent_tensors(valid, tmp_path, name):
    change, match = BAD_TENSORS[name]
    assert_rejected(resealed(tmp_path, valid[0], change_tensors=change), valid[1], match)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_tensor_payload_only_gives_session_file_error(valid, tmp_path_factory, data):
    """Checksums made valid again: the tensor index and layout checks alone must catch what is wrong."""
    source = tmp_path_factory.mktemp("src") / "s.mlxchat"
    source.write_bytes(valid[0])
    header, payload = read_file(source)
    raw = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, min(len(raw) - 1, 3000)))  # mostly the index
        raw[at] = data.draw(st.integers(0, 255))
    path = tmp_path_factory.mktemp("p") / "p.mlxchat"
    write_file(path, encode_header(header), [bytes(raw)])
    try:
        ChatSession.load(path, valid[1])
    except SessionFileError:
        pass

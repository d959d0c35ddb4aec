"""A session header keeps every generation parameter: file_header reads each GenerationParams field by name
(typed), so a field added to GenerationParams but not to ``_read_params`` would come back as its default."""

from __future__ import annotations

import json
from dataclasses import fields

import mlxcore  # noqa: F401  (before mlx.core, as everywhere)
import pytest
from mlxcore import GenerationParams
from sessions.errors import SessionFileError
from sessions.file_header import build_header, read_saved_session

CHANGED = {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 1.2,
           "repetition_context": 10, "seed": 3, "max_tokens": 9, "stop": ("\n\n",), "prefill_chunk": 64,
           "ignore_eos": True}


def _header(params: GenerationParams) -> dict[str, object]:
    header = build_header(created=1.0, title=None, model=("m", "f"), draft=None, params=params,
                          enable_thinking=False, use_draft=False, messages=[], kind="standard", caches={})
    return json.loads(json.dumps(header))


def test_every_generation_parameter_round_trips_through_a_header():
    assert set(CHANGED) == {f.name for f in fields(GenerationParams)}, \
        "GenerationParams changed: add the new field here and to file_header._read_params"
    params = GenerationParams(**CHANGED)
    assert all(getattr(params, name) != getattr(GenerationParams(), name) for name in CHANGED)
    assert read_saved_session(_header(params), "test").params == params


def test_a_parameter_the_header_leaves_out_keeps_its_default():
    header = _header(GenerationParams(temperature=0.7))
    header["params"] = {"temperature": 0.7}  # an older mlxchat's header
    assert read_saved_session(header, "test").params == GenerationParams(temperature=0.7)


@pytest.mark.parametrize("name, value, said", [("top_k", 1.5, "a whole number"), ("stop", "x", "a list of text"),
                                               ("seed", True, "a whole number or null"), ("top_p", None, "a number")])
def test_a_parameter_of_the_wrong_type_is_named(name, value, said):
    header = _header(GenerationParams())
    header["params"] = {name: value}
    with pytest.raises(SessionFileError, match=f"'{name}' in 'params' must be {said}"):
        read_saved_session(header, "test")

"""Core errors name the API's settings; ``mlxchat`` shows them as its flags (``app/flags.py``)."""

from __future__ import annotations

import pytest

from app.flags import in_flags
from mlxcore import KVConfig, UsageError, check_num_draft
from mlxcore.kv.budget import parse_max_kv


def test_the_apis_names_become_flags_and_nothing_else_changes():
    text = 'use kind="rotating" or kind="paged", a larger max_kv, kv_bits=8 (kv_bits), num_draft=4; max_kv_bytes'
    assert in_flags(text) == ("use --kv rotating or --kv paged, a larger --max-kv, --kv-bits 8 (--kv-bits), "
                              "--num-draft=4; max_kv_bytes")
    assert in_flags("The prompt has 12 tokens.") == "The prompt has 12 tokens."


@pytest.mark.parametrize("raise_it, api, flag", [
    (lambda: KVConfig(kind="standard", kv_bits=8), 'kind="paged"', "--kv paged"),
    (lambda: check_num_draft(0), "num_draft must", "--num-draft must"),
    (lambda: parse_max_kv("12x"), "max_kv '12x'", "--max-kv '12x'"),
])
def test_core_errors_speak_the_api_and_read_as_flags_on_the_command_line(raise_it, api, flag):
    with pytest.raises((ValueError, UsageError)) as error:
        raise_it()
    assert api in str(error.value) and "--" not in str(error.value)
    assert flag in in_flags(str(error.value))

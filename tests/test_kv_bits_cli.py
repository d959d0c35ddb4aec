"""``--kv-bits``: what the command line takes, and a whole answer with 8-bit keys and values."""

from __future__ import annotations

import json
import subprocess
import sys

from app.cli import main


def test_only_8_bits_is_offered_and_says_why(capsys):
    assert main(["ask", "--kv-bits", "4", "hi"]) == 2
    err = capsys.readouterr().err
    assert "only 8 is offered" in err and "Traceback" not in err


def test_the_standard_cache_cannot_be_quantized(capsys):
    assert main(["ask", "--kv", "standard", "--kv-bits", "8", "hi"]) == 2
    assert "--kv paged or --kv rotating" in capsys.readouterr().err


def test_ask_answers_with_8_bit_kv_and_its_memory_is_smaller():
    def kv_bytes(*options: str) -> int:
        run = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--model", "mini-target", "--no-draft",
                              "--no-think", "--max-tokens", "8", "--json", *options, "Name three colours."],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        final = json.loads(run.stdout.strip().splitlines()[-1])
        assert final["stats"]["generated_tokens"] == 8
        return final["stats"]["kv_bytes"]

    assert 0 < kv_bytes("--kv-bits", "8", "--max-kv", "1GB") < kv_bytes("--max-kv", "1GB")

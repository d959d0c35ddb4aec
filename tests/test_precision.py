"""Float32 products stay float32: importing mlxcore turns MLX's TF32 off, unless the user set it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import mlxcore, os; print(os.environ.get('MLX_ENABLE_TF32'))"


@pytest.mark.parametrize("given,expected", [(None, "0"), ("1", "1"), ("0", "0")])
def test_importing_mlxcore_keeps_float32_products_unless_the_user_chose(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "MLX_ENABLE_TF32"}
    if given is not None:
        env["MLX_ENABLE_TF32"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected

"""The product type-checks with mypy at the level pyproject's [tool.mypy] sets (issue 34): every function
typed, no explicit Any, no Any returned where a type is declared; and no module of the product, checked by
mypy or not yet, names typing's Any."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("mlxcore", "sessions", "app")


def test_mypy_finds_nothing_in_the_typed_modules():
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success" in done.stdout


def uses_of_any(tree: ast.Module) -> list[int]:
    """Lines that import typing's Any or name it (``typing.Any``, or ``Any`` once imported)."""
    lines = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module in ("typing", "typing_extensions") and any(a.name == "Any" for a in node.names)]
    lines += [node.lineno for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and node.attr == "Any" and isinstance(node.value, ast.Name)
              and node.value.id in ("typing", "t")]
    return sorted(lines)


def test_no_module_of_the_product_uses_any():
    found = {str(path.relative_to(ROOT)): lines for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
             if (lines := uses_of_any(ast.parse(path.read_text(encoding="utf-8"))))}
    assert not found, f"typing.Any in the product (give the real type, a Protocol, or object): {found}"


def test_the_any_check_finds_each_way_of_writing_it():
    assert uses_of_any(ast.parse("from typing import Any\nx: Any = 1")) == [1]
    assert uses_of_any(ast.parse("import typing\nx: typing.Any = 1")) == [2]
    assert uses_of_any(ast.parse("from typing import Mapping\nx: Mapping[str, object] = {}")) == []

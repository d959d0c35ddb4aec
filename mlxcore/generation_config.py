"""The sampling a model recommends, from its ``generation_config.json`` (as Hugging Face repos ship it).

Qwen3's says temperature 0.6, top-p 0.95, top-k 20 and warns that greedy decoding
degrades its thinking. When the user gives no sampling option, mlxchat uses these;
its own defaults (``GenerationParams``) apply only to what the file does not set.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TypeGuard

from mlxcore.errors import ModelLoadError

FILE = "generation_config.json"
FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # named alike in the file and here


def read_generation_defaults(folder: Path) -> dict[str, float]:
    """GenerationParams fields the model's file sets (empty when it has no file).
    ``do_sample: false`` means greedy. A value of the wrong type or out of range is
    left out (the default applies); a file that is not JSON is a ModelLoadError."""
    path = Path(folder) / FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ModelLoadError(f"{path} cannot be read ({error}); restore it or download the model again.") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object; restore it or download the model again.")
    if data.get("do_sample") is False:
        return {"temperature": 0.0}
    return {field: int(value) if field == "top_k" else float(value)
            for field in FIELDS if _valid(value := data.get(field), field)}


def _valid(value: object, field: str) -> TypeGuard[float]:
    from mlxcore.params import GenerationParams
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if field == "top_k" and not float(value).is_integer():
        return False
    try:
        GenerationParams().replaced({field: int(value) if field == "top_k" else float(value)})
    except ValueError:
        return False
    return True

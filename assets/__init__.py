"""Files that ship with mlxchat: the embedded demonstration models, and Qwen3's tokenizer (for twins)."""

from pathlib import Path

MODELS_DIR = Path(__file__).parent / "models"
QWEN3_TOKENIZER_DIR = Path(__file__).parent / "qwen3_tokenizer"  # Apache-2.0, see its NOTICE


def embedded_names() -> list[str]:
    """Names of the models that ship in assets/models (a folder with a config.json each)."""
    if not MODELS_DIR.is_dir():
        return []
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())

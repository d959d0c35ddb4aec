"""Files that ship with mlxchat: the embedded demonstration models, and Qwen3's tokenizer (for twins)."""

import json
from pathlib import Path

MODELS_DIR = Path(__file__).parent / "models"
QWEN3_TOKENIZER_DIR = Path(__file__).parent / "qwen3_tokenizer"  # Apache-2.0, see its NOTICE


def embedded_names(drafters: bool = False) -> list[str]:
    """Names of the models that ship in assets/models (a folder with a config.json each); ``drafters``: and of
    the block drafters (mini-dflash), which are no models to chat with."""
    if not MODELS_DIR.is_dir():
        return []
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file()
                  and (drafters or not _drafter(p)))


def _drafter(folder: Path) -> bool:
    """A block drafter's folder (DFlash layout: mini-dflash) is not a model to chat with."""
    return "dflash_config" in json.loads((folder / "config.json").read_text())

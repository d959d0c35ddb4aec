"""Files that ship with mlxchat: the embedded demonstration models, and Qwen3's tokenizer (for twins)."""

from pathlib import Path

MODELS_DIR = Path(__file__).parent / "models"
QWEN3_TOKENIZER_DIR = Path(__file__).parent / "qwen3_tokenizer"  # Apache-2.0, see its NOTICE

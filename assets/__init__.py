"""Files that ship with mlxchat: the embedded demonstration models."""

from pathlib import Path

MODELS_DIR = Path(__file__).parent / "models"

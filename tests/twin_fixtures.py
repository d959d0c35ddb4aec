"""Twins for tests, built once per pytest run into its temporary folder.

Import the fixtures a module needs, e.g. ``from twin_fixtures import twin_8b, twin_06b  # noqa: F401``.
Each fixture gives the twin's folder (load it with ``mlxcore.loading.load_model(str(folder))``).
Every module that imports them shares one root, so a twin is built once per run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.twins import twin_folder

PADDED_VOCAB_EXTRA = 64  # rows a padded draft has beyond the target's 151,936


@pytest.fixture(scope="session")
def twins_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's twin cache; build other variants into it with ``twin_folder(..., root=twins_root)``.

    Under pytest-xdist each worker has its own base folder; the twins go one level up, shared by the
    run's workers (``twin_folder`` builds under a lock, so two workers build a twin once).
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return shared / "twins"


@pytest.fixture(scope="session")
def twin_8b(twins_root: Path) -> Path:
    """Twin of mlx-community/Qwen3-8B-4bit: 4-bit, bf16 scales."""
    return twin_folder("qwen3-8b", bits=4, root=twins_root)


@pytest.fixture(scope="session")
def twin_06b(twins_root: Path) -> Path:
    """Twin of mlx-community/Qwen3-0.6B-4bit: 4-bit, bf16 scales."""
    return twin_folder("qwen3-0.6b", bits=4, root=twins_root)


@pytest.fixture(scope="session")
def twin_8b_f32(twins_root: Path) -> Path:
    """The 8B twin in float32 (same seed): fast on CPU, for benches and long runs."""
    return twin_folder("qwen3-8b", bits=None, root=twins_root)


@pytest.fixture(scope="session")
def twin_06b_f32(twins_root: Path) -> Path:
    """The 0.6B twin in float32 (same seed)."""
    return twin_folder("qwen3-0.6b", bits=None, root=twins_root)


@pytest.fixture(scope="session")
def twin_06b_f32_padded(twins_root: Path) -> Path:
    """A float32 0.6B twin whose vocab_size is PADDED_VOCAB_EXTRA larger than the 8B twin's."""
    return twin_folder("qwen3-0.6b", bits=None, root=twins_root, vocab_pad=PADDED_VOCAB_EXTRA)

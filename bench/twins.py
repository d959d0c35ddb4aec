"""Twins: seeded random-weight stand-ins for the users' Qwen3 models, built on demand into a cache.

A twin has the real model's vocabulary, KV geometry, query heads, file layout
(mlx-community's: 4-bit with bf16 scales) and Qwen3's own tokenizer and chat
template, so tests and benches see what only the real pair would otherwise
show. Folders are built once per (twin, bits, seed, vocab padding) into
``$MLXCHAT_TWINS``, else ``$XDG_CACHE_HOME/mlxchat/twins`` (``~/.cache/...``).

    python -m bench.twins qwen3-8b --bits none     # prints the folder, building it if needed
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from bench.twin_build import RECIPE_VERSION, write_twin
from bench.twin_specs import TWINS, TwinSpec

__all__ = ["TWINS", "TwinSpec", "twin_folder", "twins_root"]

BITS = (4, None)  # 4-bit with bf16 scales (the users' repos), or float32 (fast CPU benches)


def twin_folder(name: str, *, bits: int | None = 4, seed: int = 0, root: Path | None = None,
                vocab_pad: int = 0, layers: int | None = None) -> Path:
    """The folder of twin ``name`` (4-bit with bf16 scales, or float32 with bits=None), built on first use.

    ``vocab_pad`` adds that many embedding rows beyond the real vocabulary (a
    draft padded larger than its target). ``layers`` keeps only that many of the model's layers (each layer as
    the real one's: a cheap stand-in where the depth does not matter). ``root`` defaults to ``twins_root()``.
    A build goes to a hidden folder that is renamed into place when complete,
    under a lock, so a killed build leaves no twin and concurrent callers build once.
    """
    spec = _spec(name, layers)
    if bits not in BITS:
        raise ValueError(f"bits must be 4 or None (float32), not {bits!r}")
    if seed < 0 or vocab_pad < 0:
        raise ValueError(f"seed and vocab_pad must be at least 0, got {seed} and {vocab_pad}")
    root = Path(root) if root is not None else twins_root()
    folder = root / folder_name(name, bits=bits, seed=seed, vocab_pad=vocab_pad, layers=layers)
    if folder.is_dir():  # only a complete build is ever renamed to this name
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{folder.name}.lock"):
        if not folder.is_dir():
            partial = root / f".{folder.name}.partial"
            shutil.rmtree(partial, ignore_errors=True)  # left by a build that was killed
            write_twin(partial, spec, bits=bits, seed=seed, vocab_pad=vocab_pad)
            partial.rename(folder)
    return folder


def twins_root() -> Path:
    """Where twins are cached: $MLXCHAT_TWINS, else the user's cache folder + mlxchat/twins."""
    if chosen := os.environ.get("MLXCHAT_TWINS"):
        return Path(chosen).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "mlxchat" / "twins"


def folder_name(name: str, *, bits: int | None, seed: int, vocab_pad: int = 0, layers: int | None = None) -> str:
    """E.g. ``qwen3-8b-4bit-seed0-1a2b3c4d``; the tail changes with the spec or the weight recipe."""
    parts = [name, f"{bits}bit" if bits else "float32", f"seed{seed}"]
    if vocab_pad:
        parts.append(f"vocabpad{vocab_pad}")
    if layers:
        parts.append(f"layers{layers}")
    recipe = repr((_spec(name, layers), bits, vocab_pad, RECIPE_VERSION)).encode()
    return "-".join(parts + [hashlib.sha256(recipe).hexdigest()[:8]])


def _spec(name: str, layers: int | None = None) -> TwinSpec:
    if name not in TWINS:
        raise ValueError(f"unknown twin {name!r}; choose one of {', '.join(sorted(TWINS))}")
    spec = TWINS[name]
    if layers is None:
        return spec
    if spec.linear is not None or not 0 < layers <= spec.num_layers:
        raise ValueError(f"a twin of {name} keeps 1 to {spec.num_layers} of its layers (not a hybrid's), not {layers}")
    return replace(spec, num_layers=layers)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` between processes; the OS drops it if the holder dies."""
    with path.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.twins",
                                     description="Print the folder of a twin, building it if needed.")
    parser.add_argument("name", choices=sorted(TWINS))
    parser.add_argument("--bits", default="4", choices=["4", "none"],
                        help="4: 4-bit with bf16 scales, as mlx-community ships; none: float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-pad", type=int, default=0, help="extra embedding rows (a padded draft)")
    parser.add_argument("--root", type=Path, help="cache folder (default: $MLXCHAT_TWINS or ~/.cache)")
    args = parser.parse_args(argv)
    bits = None if args.bits == "none" else int(args.bits)
    try:
        folder = twin_folder(args.name, bits=bits, seed=args.seed, root=args.root, vocab_pad=args.vocab_pad)
    except ValueError as error:
        parser.error(str(error))
    print(folder)


if __name__ == "__main__":
    main()

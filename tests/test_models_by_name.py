"""`--model` names what `mlxchat models` lists, for ask, the window and serve alike: the folders under
--models-dir (or $MLXCHAT_MODELS_DIR) by their names, and the hub cache's repos by their ids; anything else
goes on as before. The catalog reads directories only: the window's process lists it without MLX."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import build_parser
from app.options import model_choice
from app.tui.run import open_command
from assets import MODELS_DIR
from fake_hub import add_to_fake_hub
from mlxcore import ModelLoadError

ROOT = Path(__file__).resolve().parent.parent
NEWNAME = "my-model"  # the embedded target's files, under a name no other source has
QUESTION = ["--no-draft", "--no-think", "--max-tokens", "32", "What is 12 + 7?"]


def mlxchat(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    mine = {name: value for name, value in os.environ.items() if name != "MLXCHAT_MODELS_DIR"}
    full_env = mine | {"HF_HUB_OFFLINE": "1"} | (env or {})
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    """NEWNAME (a folder of links to the embedded target's files), mini-draft (hides the embedded one), and a
    folder that holds no model."""
    folder = tmp_path / "models"
    (folder / NEWNAME).mkdir(parents=True)
    for file in (MODELS_DIR / "mini-target").iterdir():
        (folder / NEWNAME / file.name).symlink_to(file)
    (folder / "mini-draft").symlink_to(MODELS_DIR / "mini-draft", target_is_directory=True)
    (folder / "not-a-model").mkdir()
    return folder


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    add_to_fake_hub(cache, "someone/tiny-draft", MODELS_DIR / "mini-draft")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("MLXCHAT_MODELS_DIR", raising=False)
    return cache


@pytest.mark.slow
def test_ask_answers_with_a_models_dir_model_named_by_its_folder(models_dir):
    by_name = mlxchat("ask", "--models-dir", str(models_dir), "--model", NEWNAME, *QUESTION)
    embedded = mlxchat("ask", "--model", "mini-target", *QUESTION)
    assert by_name.returncode == 0, by_name.stderr
    assert "19" in by_name.stdout and by_name.stdout == embedded.stdout, "the same weights give the same answer"


@pytest.mark.slow
def test_ask_finds_the_models_dir_of_the_environment(models_dir):
    done = mlxchat("ask", "--model", NEWNAME, *QUESTION, env={"MLXCHAT_MODELS_DIR": str(models_dir)})
    assert done.returncode == 0 and "19" in done.stdout, done.stderr


def test_a_name_no_source_has_is_the_unknown_model_error(models_dir):
    done = mlxchat("ask", "--models-dir", str(models_dir), "--model", "no-such-model", "hi")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Unknown model 'no-such-model'" in done.stderr


@pytest.mark.parametrize("command", [["models"], ["ask", "hi"], ["serve"], []], ids=["models", "ask", "serve", "window"])
def test_a_models_dir_that_is_no_folder_is_one_line_for_every_command(tmp_path, command):
    missing = tmp_path / "nowhere"
    done = mlxchat(*command, "--models-dir", str(missing)) if command else mlxchat("--models-dir", str(missing))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr == f"mlxchat: --models-dir {missing} is not a folder.\n"


def test_models_lists_the_models_dir_the_hub_cache_and_the_embedded_models(models_dir, hub_cache):
    done = mlxchat("models", "--models-dir", str(models_dir), "--json", env={"HF_HUB_CACHE": str(hub_cache)})
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert listing["models_dir"] == str(models_dir) and listing["hub_cache"] == str(hub_cache)
    rows = {row["id"]: row for row in listing["models"]}
    assert list(rows) == ["mini-draft", NEWNAME, "someone/tiny-draft", "mini-target", "mini-target-4bit"]  # (a block drafter is not a model)
    assert rows[NEWNAME] == {"id": NEWNAME, "source": "models-dir", "path": str(models_dir / NEWNAME)}
    assert rows["mini-draft"]["source"] == "models-dir", "a --models-dir folder hides the embedded one"
    assert rows["someone/tiny-draft"]["source"] == "hf-cache"
    assert (Path(rows["someone/tiny-draft"]["path"]) / "config.json").is_file()
    assert rows["mini-target"] == {"id": "mini-target", "source": "embedded", "path": str(MODELS_DIR / "mini-target")}


def test_models_prints_one_line_a_model_and_reads_the_environment(models_dir, hub_cache):
    done = mlxchat("models", env={"HF_HUB_CACHE": str(hub_cache), "MLXCHAT_MODELS_DIR": str(models_dir)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 5
    assert [line.split()[:2] for line in lines if line.startswith(NEWNAME)] == [[NEWNAME, "models-dir"]]
    assert "--models-dir" in mlxchat("models", "--help").stdout


def test_model_choice_resolves_listed_names_and_passes_the_rest_on(models_dir, hub_cache):
    def choice(*args: str):
        return model_choice(build_parser().parse_args(["ask", "--models-dir", str(models_dir), *args, "hi"]))

    assert choice("--model", NEWNAME) == choice("--model", str(models_dir / NEWNAME))
    assert choice("--model", NEWNAME).model == str(models_dir / NEWNAME)
    assert choice("--model", NEWNAME, "--draft", "mini-draft").draft == "mini-draft", "the user's draft stays"
    assert not choice("--model", NEWNAME).no_draft, "no --no-draft given: none forced"
    # a cached repo loads by its id, as today: from the cache offline, or what is newer online
    for given in ("someone/tiny-draft", "someone/not-cached", "mini-target", str(models_dir / NEWNAME), None):
        assert choice(*(("--model", given) if given else ())).model == given
    # what the loader would refuse is refused here, before any model code loads: the loader's own message
    for given, said in (("/some/folder", "There is no folder"), ("no-such-model", "Unknown model")):
        for flag in ("--model", "--draft"):
            with pytest.raises(ModelLoadError, match=said):
                choice(flag, given)
    assert choice("--draft", "no-such-model", "--no-draft").no_draft, "a draft left out is not looked for"


def test_the_windows_first_model_is_resolved_as_asks(models_dir, hub_cache):
    args = build_parser().parse_args(["--models-dir", str(models_dir), "--model", NEWNAME, "--no-draft"])
    first = open_command(args)
    assert (first.model, first.draft, first.no_draft) == (str(models_dir / NEWNAME), None, True)


def test_listing_and_resolving_load_no_mlx(models_dir, hub_cache):
    """The window's process lists the catalog (F5) and resolves --model: neither may load MLX."""
    code = ("import sys; from pathlib import Path; from app.options import model_catalog; "
            f"listed = [e.id for e in model_catalog(Path({str(models_dir)!r})).listing()]; "
            f"assert {NEWNAME!r} in listed and 'someone/tiny-draft' in listed, listed; "
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')); "
            "print(loaded); sys.exit(1 if loaded else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HF_HUB_CACHE=str(hub_cache)))
    assert done.returncode == 0, done.stdout + done.stderr

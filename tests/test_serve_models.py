"""Local models by name on a real `mlxchat serve`: /v1/models lists what loads (the started model,
--models-dir, the hub cache); a request naming another model loads it (waiting while the first one
serves), --max-models evicts the least recently used, and the loaded models' KV never goes over the
budget. Unknown names are a 404 in each API's shape. The second model is the embedded draft, served
alone from a --models-dir."""

from __future__ import annotations

import threading

import anthropic
import openai
import pytest

from fake_hub import add_to_fake_hub
from assets import MODELS_DIR
from serve_process import ServeProcess, http, poll_until

pytestmark = pytest.mark.slow

TARGET = ("--model", "mini-target", "--no-draft")  # the embedded models, each alone: both load in a blink
QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def ask(server: ServeProcess, model: str, **options) -> str:
    options = {"temperature": 0, "max_tokens": 12} | options
    reply = server.client().chat.completions.create(model=model, messages=QUESTION, extra_body=NO_THINKING,
                                                    **options)
    assert reply.model == model and reply.choices[0].finish_reason in ("stop", "length"), reply
    return reply.choices[0].message.content


@pytest.fixture
def models_dir(tmp_path):
    """A --models-dir holding the embedded draft (as ``mini-draft``) and a folder that is no model."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "mini-draft").symlink_to(MODELS_DIR / "mini-draft", target_is_directory=True)
    (folder / "not-a-model").mkdir()
    return folder


def listed(server: ServeProcess) -> dict[str, dict]:
    status, _, body = http("GET", f"{server.url}/v1/models")
    assert status == 200, body
    return {entry["id"]: entry for entry in body["data"]}


def loaded(server: ServeProcess) -> list[str]:
    return http("GET", f"{server.url}/health")[2]["models_loaded"]


class KVWatch:
    """Scrapes /metrics while a test runs: the most KV bytes seen, the peak the pools report, the budget."""

    def __init__(self, server: ServeProcess) -> None:
        self.server, self.samples = server, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.samples.append(self.server.metrics())

    def __enter__(self) -> KVWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.samples.append(self.server.metrics())

    def assert_within_budget(self) -> None:
        budget = {s["mlxchat_kv_budget_bytes"] for s in self.samples}
        assert len(budget) == 1, f"one budget for every model, not {budget}"
        limit = budget.pop()
        assert max(s["mlxchat_kv_bytes"] for s in self.samples) <= limit
        assert self.samples[-1]["mlxchat_kv_peak_bytes"] <= limit


def test_a_second_model_loads_by_name_while_the_first_serves_and_max_models_1_evicts_it(tmp_path, models_dir):
    # replies run to max_tokens, a step at least 10 ms apart: the first model is still serving when asked for the second
    slow = {"MLXCHAT_TEST_STEP_SECONDS": "0.01", "MLXCHAT_TEST_IGNORE_EOS": "1"}
    with ServeProcess(tmp_path, "--max-models", "1", "--models-dir", str(models_dir), pair=TARGET,
                      script="serve_slow_server.py", env=slow) as server, KVWatch(server) as watch:
        models = listed(server)
        assert models["mini-target"]["loaded"] and models["mini-target"]["source"] == "started"
        assert models["mini-draft"] == models["mini-draft"] | {"loaded": False, "source": "models-dir"}
        reference = ask(server, "mini-target", max_tokens=60)
        stream = server.client().chat.completions.create(model="mini-target", messages=QUESTION, stream=True,
                                                         temperature=0, max_tokens=60, extra_body=NO_THINKING)
        first = [next(stream)]  # the first model is serving this stream now
        second: list[str] = []
        asking = threading.Thread(target=lambda: second.append(ask(server, "mini-draft")))
        asking.start()
        poll_until(lambda: http("GET", f"{server.url}/health")[2]["models_loading"] == ["mini-draft"])
        assert loaded(server) == ["mini-target"] and not second, "the stream's model stays until its reply ends"
        text = "".join(c.choices[0].delta.content or "" for c in first + list(stream))
        asking.join(timeout=60)
        assert text == reference and second and second[0], "both models answered"
        assert loaded(server) == ["mini-draft"], "--max-models 1: the least recently used went"
        assert ask(server, "mini-target", max_tokens=60) == reference, "loaded again, it answers as before"
        assert ask(server, "mini-draft") == second[0]
    watch.assert_within_budget()
    log = server.log()
    assert "unloaded mini-target to make room for mini-draft (--max-models 1)" in log
    assert "loading mini-target again" in log


def test_two_loaded_models_share_one_kv_budget(tmp_path, models_dir):
    """--max-models 2 in a 2 MB budget: the first model's prompt fills most of it; the second model's takes the
    first's cached blocks back rather than go over, so the first reads its prompt again next time (the disk
    tier off: with it, those blocks come back from disk, tests/test_serve_disk_kv.py)."""
    long = [{"role": "user", "content": "the quick brown fox " * 66}]  # 604 tokens: 1.9 MB of mini-target's KV
    with ServeProcess(tmp_path, "--max-models", "2", "--max-kv", "2MB", "--disk-kv", "0", "--models-dir",
                      str(models_dir), pair=TARGET) as server, KVWatch(server) as watch:
        def cached(model: str) -> int:
            reply = server.client().chat.completions.create(model=model, messages=long, max_tokens=4, temperature=0)
            return reply.usage.prompt_tokens_details.cached_tokens

        assert cached("mini-target") == 0 and server.metrics()["mlxchat_kv_bytes"] > 1.5e6
        assert cached("mini-draft") == 0
        assert sorted(loaded(server)) == ["mini-draft", "mini-target"]
        assert cached("mini-target") == 0, "its cached prefix made room for the other model's prompt"
    watch.assert_within_budget()


def test_models_dir_and_hub_cache_models_load_by_name_offline(tmp_path, models_dir):
    cache = tmp_path / "hub"
    add_to_fake_hub(cache, "someone/tiny-draft", MODELS_DIR / "mini-draft")
    with ServeProcess(tmp_path, "--models-dir", str(models_dir), pair=TARGET,
                      env={"HF_HUB_CACHE": str(cache)}) as server:
        models = listed(server)
        assert list(models) == ["mini-target", "mini-draft", "someone/tiny-draft"], "no embedded demos offered"
        assert models["mini-draft"]["source"] == "models-dir" and models["someone/tiny-draft"]["source"] == "hf-cache"
        assert ask(server, "someone/tiny-draft") == ask(server, "mini-draft")
        with pytest.raises(openai.NotFoundError) as caught:
            ask(server, "someone/not-cached")
        assert caught.value.body["code"] == "model_not_found" and "--allow-download" in caught.value.body["message"]


def test_an_unknown_model_is_a_404_in_each_apis_shape(tmp_path):
    with ServeProcess(tmp_path, pair=TARGET) as server:
        with pytest.raises(openai.NotFoundError) as caught:
            server.client().completions.create(model="no-such-model", prompt="hi", max_tokens=2)
        assert caught.value.body == caught.value.body | {"code": "model_not_found", "param": "model"}
        with pytest.raises(anthropic.NotFoundError) as refused:
            server.anthropic().messages.create(model="no-such-model", max_tokens=5,
                                               messages=[{"role": "user", "content": "hi"}])
        assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "not_found_error"
        assert "no-such-model" in refused.value.body["error"]["message"]
        assert "Traceback" not in server.log()


def test_allow_download_fetches_a_repo_by_name_off_the_engine_thread(tmp_path):
    """Offline here, so a repo the cache lacks is a 404 that says so; one it holds loads by its repo id."""
    cache = tmp_path / "hub"
    add_to_fake_hub(cache, "someone/tiny-draft", MODELS_DIR / "mini-draft")
    with ServeProcess(tmp_path, "--allow-download", pair=TARGET, env={"HF_HUB_CACHE": str(cache)}) as server:
        assert ask(server, "someone/tiny-draft")
        with pytest.raises(openai.NotFoundError) as caught:
            ask(server, "someone/not-cached")
        assert caught.value.body["code"] == "model_not_found" and "not in the local hub cache" in caught.value.body["message"]
        assert loaded(server) == ["someone/tiny-draft"]

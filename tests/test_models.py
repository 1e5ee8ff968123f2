"""Tiny model builder and model-reference resolution (all offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hone.models import build_byte_tokenizer, build_tiny_model, resolve_model
from hone.models import resolve as resolve_module


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_default_model_loads_back_with_plain_auto_classes(tiny_dir: Path) -> None:
    assert (tiny_dir / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen2"
    assert model.dtype == torch.float32
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # tied
    assert 0.9e6 < model.num_parameters() < 1.2e6
    assert model.config.vocab_size == len(tokenizer)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1)
    assert model.generation_config.eos_token_id == 1 and model.generation_config.pad_token_id == 0
    ids = tokenizer("12+3=", return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, 5, len(tokenizer))


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", num_layers=1)


TEXTS = ["123+45=", " a , b . c ", "19 36 55 7>72:", "x\n  y\n", "(1*2)/3-4", "Hello, World!", "é€ 😀"]


@pytest.mark.parametrize("arch_dir", ["tiny_dir", "tiny_llama_dir"])
def test_tokenizer_is_byte_level_and_round_trips(arch_dir: str, request: pytest.FixtureRequest) -> None:
    # qwen2 directories load as Qwen2Tokenizer and llama ones as the generic backend: both must agree.
    tokenizer = AutoTokenizer.from_pretrained(request.getfixturevalue(arch_dir))
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert ids == [b + 2 for b in text.encode()], text
        assert tokenizer.decode(ids) == text


def test_eos_is_a_single_token_dropped_by_skip_special_tokens(tiny_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tokenizer("168")["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids) == "168<eos>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "168"


def test_chat_template_renders_turns_and_ends_assistant_turns_with_eos(tiny_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    chat = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == "user: 2+2=\nassistant: 4<eos>\n"
    prompt = tokenizer.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "user: 2+2=\nassistant: "


def test_same_seed_same_weights_and_global_rng_untouched(tmp_path: Path) -> None:
    kwargs = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "head_dim": 16}
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=7, **kwargs))
    assert torch.equal(torch.rand(1), expected_next)
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=7, **kwargs))
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", seed=8, **kwargs))
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True))


def test_llama_arch_with_head_dim_not_hidden_over_heads(tmp_path: Path) -> None:
    out = build_tiny_model(
        tmp_path / "m", arch="llama", hidden_size=32, num_heads=2, head_dim=8, num_layers=1
    )
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "llama"
    assert model.model.layers[0].self_attn.q_proj.out_features == 2 * 8
    assert model(torch.tensor([[3, 4, 5]])).logits.shape == (1, 3, model.config.vocab_size)


def test_unknown_arch_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tiny model arch 'gpt9'"):
        build_tiny_model(tmp_path, arch="gpt9")
    assert build_byte_tokenizer().vocab_size == 2 + 256


def test_resolve_tiny_builds_once_and_reuses_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    real_build = resolve_module.build_tiny_model

    def counting_build(out_dir: Path, **kwargs: object) -> Path:
        calls.append(Path(out_dir))
        return real_build(out_dir, hidden_size=32, num_layers=1, num_heads=2, head_dim=16)

    monkeypatch.setattr(resolve_module, "build_tiny_model", counting_build)
    first = resolve_model("tiny", cache_dir=tmp_path)
    assert resolve_model("tiny:default", cache_dir=tmp_path) == first
    assert len(calls) == 1
    assert Path(first).parent == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == [Path(first).name]  # no leftover temp dirs
    assert AutoTokenizer.from_pretrained(first).decode([51, 52]) == "12"
    assert resolve_model("tiny:llama", cache_dir=tmp_path) != first
    with pytest.raises(ValueError, match="unknown tiny model preset 'huge'"):
        resolve_model("tiny:huge", cache_dir=tmp_path)


def test_resolve_failed_build_leaves_no_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_build(out_dir: Path, **kwargs: object) -> Path:
        (Path(out_dir) / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(resolve_module, "build_tiny_model", failing_build)
    with pytest.raises(OSError, match="disk full"):
        resolve_model("tiny", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_resolve_paths_and_hub_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "org" / "name"
    model_dir.mkdir(parents=True)
    assert resolve_model(str(model_dir)) == str(model_dir)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/name") == "org/name"  # an existing relative directory wins over the hub
    monkeypatch.setattr(resolve_module, "_hub_answers", lambda name: True)  # no network in tests
    assert resolve_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    for missing in ["./nope", str(tmp_path / "nope"), "~/surely-missing-hone-model", "a/b/c"]:
        with pytest.raises(FileNotFoundError, match="model directory not found") as info:
            resolve_model(missing)
        assert missing in str(info.value)
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(NotADirectoryError, match=r"weights\.bin"):
        resolve_model("weights.bin")

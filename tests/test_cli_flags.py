"""The command line's answers to other tools' habits (issue 49, item 5): a TRL/argparse-style option
(`--learning_rate 1e-5`) answered with the `section.key=value` form of the same setting, and an unknown key's
did-you-mean naming every candidate, every unknown key of the recipe in one line. In-process `main`."""

from __future__ import annotations

import pytest

from hone.cli import main
from hone.config import ConfigError, load_config


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("hone: error: ")  # one line, no usage
    return err


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--learning_rate", "1e-5"], "--learning_rate 1e-5 is trainer.lr=1e-5 TRL"),
        (["--learning_rate=1e-5"], "--learning_rate=1e-5 is trainer.lr=1e-5"),
        (["--learning-rate", "1e-5"], "is trainer.lr=1e-5"),
        (["--trainer.lr", "3e-6"], "--trainer.lr 3e-6 is trainer.lr=3e-6"),
        (["--temperature", "0.7"], "rollout.temperature=0.7 or eval.temperature=0.7"),
    ],
)
def test_an_option_naming_a_setting_is_answered_with_its_override(
    words: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error(["train", "recipe.yaml", *words], capsys)
    assert "section.key=value" in err and said in err


def test_every_option_is_translated_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["train", "--learning_rate", "1e-5", "--num_generations=8", "data.task=null"], capsys)
    assert "trainer.lr=1e-5" in err and "rollout.n=8" in err


@pytest.mark.parametrize("option", ["--zzzqqq", "--modle"])  # a misspelt `--model`: no near-miss setting
def test_an_option_naming_nothing_keeps_argparses_error(
    option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["eval", option, "3"])
    assert f"unrecognized arguments: {option}" in capsys.readouterr().err


def test_a_did_you_mean_names_every_candidate_and_every_unknown_key() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["rollout.lr=1"])
    message = str(caught.value)
    assert "did you mean trainer.lr or sft.lr or dpo.lr or rm.lr or critic.lr or control.lr?" in message
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["learning_rate=1e-5", "num_generations=4", "beta=0.1"])
    message = str(caught.value)
    assert "\n" not in message and "more)" not in message
    for key, hone_key in [
        ("learning_rate", "trainer.lr"),
        ("num_generations", "rollout.n"),
        ("beta", "kl.coef"),
    ]:
        assert f"{key}: unknown key; did you mean" in message and hone_key in message

"""The `hone` command: help, error lines, sft and eval subcommands (in-process, tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hone.cli import _parse, main


def test_help_lists_recipes_and_main_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert (
        "recipes: agent-guess, agent-retry, default" in out
        and "algorithm.advantage" in out
        and "rollout.n" in out
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "algorithm.advantge=rloo"], "algorithm.advantge: unknown key"),
        (["train", "algorithm.advantage=nope"], "unknown advantage estimator 'nope'"),
        (["train", "no-such-recipe"], "recipe not found: no-such-recipe"),
        (["train", "--resume", "/nonexistent/run"], "no config.yaml there"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hone: error:") and message in err[0]


def test_missing_model_path_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", f"run.dir={tmp_path}", "model.path=./missing-model", "logging.progress=false"])
    assert code == 2
    assert "model directory not found: ./missing-model" in capsys.readouterr().err


def test_sft_then_eval(tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = [
        f"run.dir={tmp_path}",
        "run.name=s",
        "data.eval_size=8",
        "run.threads=1",
        "logging.progress=false",
    ]
    assert (
        main(
            [
                "sft",
                f"model.path={micro_model_dir}",
                "sft.max_steps=3",
                "sft.examples=64",
                "sft.batch_size=8",
                "sft.val_size=8",
                *common,
            ]
        )
        == 0
    )
    sft_dir = tmp_path / "s" / "sft"
    assert (sft_dir / "model.safetensors").is_file() and (sft_dir / "sft_log.jsonl").is_file()
    out_file = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--model",
                str(sft_dir),
                "--out",
                str(out_file),
                "eval.n=4",
                "eval.k=[1,4]",
                "eval.temperature=1.0",
                *common,
            ]
        )
        == 0
    )
    metrics = json.loads(out_file.read_text())
    assert 0 <= metrics["eval/pass@1"] <= metrics["eval/pass@4"] <= 1
    assert "eval/accuracy" in capsys.readouterr().out


def test_overrides_may_follow_options() -> None:
    ns = _parse(["eval", "smollm2-math", "--model", "m", "eval.n=4", "--out", "o.json", "eval.k=[1,4]"])
    assert (ns.model, ns.out) == ("m", "o.json")
    assert ns.args == ["smollm2-math", "eval.n=4", "eval.k=[1,4]"]


def test_unknown_option_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["eval", "smollm2-math", "--modle", "m"])
    assert "unrecognized arguments: --modle" in capsys.readouterr().err

"""Issue 31's first hour: your own data on the first try, every key described, `hone config`, `--dry-run`,
`--version`, "did you mean", paths relative to the recipe, and the eval split held out of the source."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import NoReturn

import pytest
import yaml

from hone.cli import main
from hone.config import ConfigError, load_config
from hone.config.keys import iter_keys, suggest
from hone.config.reference import commented_yaml, json_schema, markdown_reference
from hone.data.errors import HoneDataError
from hone.data.splits import check_data_files, load_data, split_source
from hone.version import hone_version, version_line

REPO = Path(__file__).parents[1]


def _write_rows(path: Path, n: int, prompt: str = "question", answer: str = "solution") -> Path:
    path.write_text("".join(json.dumps({prompt: f"{i}+{i}=", answer: str(2 * i)}) + "\n" for i in range(n)))
    return path


def test_every_key_is_described() -> None:
    missing = [key.name for key in iter_keys() if not key.description.strip()]
    assert not missing, f"keys without a description: {missing}"


def test_the_config_reference_and_schema_in_docs_are_current() -> None:
    # Regenerate with `hone config --markdown > docs/reference/config.md` (and --schema for the JSON file).
    assert (REPO / "docs/reference/config.md").read_text() == markdown_reference()
    assert (REPO / "docs/reference/config.schema.json").read_text() == json_schema()


def test_hone_config_prints_yaml_that_parses_back_with_descriptions_and_changes_marked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["config", "trainer.lr=3e-5", "rollout.n=4"]) == 0
    out = capsys.readouterr().out
    cfg = load_config(None, ["trainer.lr=3e-5", "rollout.n=4"])
    assert yaml.safe_load(out) == cfg.model_dump(mode="json")
    lines = out.splitlines()
    lr = lines.index("  lr: 3.0e-05  # *")  # changed from the default 1e-4: marked
    assert lines[lr - 1].startswith("  # policy learning rate")
    assert "  keep_last: 2" in lines  # the default: not marked
    assert lines[0].startswith(f"# hone {hone_version()}")
    assert commented_yaml(cfg).count("# *") >= 2


def test_version_names_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == version_line()


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("trainer.learning_rate=1e-5", "did you mean trainer.lr?"),
        ("rollout.num_generations=4", "did you mean rollout.n?"),
        ("algorithm.beta=0.04", "did you mean algorithm.kl.coef?"),
        ("algorithm.adv_estimator=rloo", "did you mean algorithm.advantage?"),
        ("trainer.lrr=1", "did you mean trainer.lr?"),  # a typo: the closest key
        ("rollout.lr=1", "did you mean trainer.lr"),  # the right key in another section
        ("algorithm=rloo", "algorithm is a section: set one of its keys"),
    ],
)
def test_unknown_keys_suggest_the_hone_key(override: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert hint in str(info.value) and "\n" not in str(info.value)


def test_no_suggestion_for_a_key_like_nothing() -> None:
    assert suggest("trainer.zzzzqqq", {}) == ""


def test_recipe_paths_resolve_against_the_recipe_folder_and_overrides_against_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    _write_rows(project / "train.jsonl", 20, prompt="prompt", answer="answer")
    (project / "recipe.yaml").write_text("data:\n  source: train.jsonl\n  eval_source: missing.jsonl\n")
    monkeypatch.chdir(elsewhere)
    cfg = load_config(project / "recipe.yaml")
    assert cfg.data.source == str(project / "train.jsonl")
    assert cfg.data.eval_source == str(project / "missing.jsonl")  # the absolute path tried, in errors too
    assert cfg.data.task is None and cfg.model.path == "tiny"  # no task unless named; an alias is kept
    cfg = load_config(project / "recipe.yaml", ["data.eval_source=mine.jsonl"])
    assert cfg.data.eval_source == str(elsewhere / "mine.jsonl")
    with pytest.raises(HoneDataError, match=rf"data.eval_source: {elsewhere / 'mine.jsonl'}: file not found"):
        check_data_files(cfg.data, has_env=False)


def test_a_reward_beside_the_recipe_imports_without_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_first_hour_reward.py").write_text(
        "def exact(completion, answer, **kw):\n    return 1.0\n"
    )
    (tmp_path / "recipe.yaml").write_text(
        "data:\n  task: arithmetic\nreward:\n  fn: my_first_hour_reward:exact\n"
    )
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    load_config(tmp_path / "recipe.yaml")
    assert str(tmp_path) in sys.path
    from hone.plugins import load_object

    assert load_object("my_first_hour_reward:exact", what="reward")(None, None) == 1.0


def test_without_eval_source_a_hashed_tenth_is_held_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = _write_rows(tmp_path / "rows.jsonl", 200, prompt="prompt", answer="answer")
    with rows.open("a") as f:  # a duplicate of every row: it must land on the same side as its twin
        f.writelines(rows.read_text().splitlines(keepends=True))
    cfg = load_config(None, ["data.task=null", f"data.source={rows}", "data.eval_size=1000"])
    train, held = split_source(cfg.data)
    assert len(held) == 40  # 10% of 400 rows (below data.eval_size)
    assert len({s.prompt for s in held}) == 40  # each problem held out once (issue 51: not twice)
    assert not {s.prompt for s in held} & {s.prompt for s in train}
    assert len(train) == 400 - 2 * 40  # each held problem's twin is left out of both sides
    assert split_source(cfg.data)[1] == held  # the same split every time, for every seed
    with caplog.at_level(logging.INFO, logger="hone"):
        _, train_again, eval_set = load_data(cfg.data, eval_size=8, seed=3)
    assert eval_set == held[:8] and train_again == train
    assert "data.eval_source not set: holding out 40 of the 400 rows" in caplog.text
    assert "; 40 more rows repeat a held-out problem and are left out of both; training on 320" in caplog.text
    cfg.data.eval_size = 5
    assert len(split_source(cfg.data)[1]) == 5


def test_too_few_rows_to_hold_out_says_set_eval_source(tmp_path: Path) -> None:
    cfg = load_config(
        None, ["data.task=null", f"data.source={_write_rows(tmp_path / 'r.jsonl', 5, 'prompt', 'answer')}"]
    )
    with pytest.raises(HoneDataError, match=r"too few to hold out 10% for eval; set data\.eval_source"):
        split_source(cfg.data)


def test_a_wrong_field_fails_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_rows(tmp_path / "mine.jsonl", 30)
    monkeypatch.chdir(tmp_path)

    def training_started(cfg: object) -> NoReturn:
        pytest.fail("training started")

    code = main(
        ["train", "data.task=null", "data.source=mine.jsonl", f"run.dir={tmp_path / 'runs'}"],
        setup=training_started,
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"data.source: {tmp_path / 'mine.jsonl'} line 1: missing field 'prompt'" in err
    assert not (tmp_path / "runs").exists()


def test_no_data_at_all_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["train", "data.task=null", f"run.dir={tmp_path}"]) == 2
    assert "data: set data.source (your jsonl/parquet file" in capsys.readouterr().err


def test_dry_run_shows_two_rendered_prompts_with_answers_and_writes_nothing(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_rows(tmp_path / "mine.jsonl", 30)
    monkeypatch.chdir(tmp_path)
    args = [
        "train",
        "--dry-run",
        "data.task=null",
        "data.source=mine.jsonl",
        "data.prompt_field=question",
        "data.answer_field=solution",
        f"model.path={micro_model_dir}",
        "reward.fn=math",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "27 training prompts, 3 held out for eval" in out
    assert out.count("--- training prompt") == 2 and "--- reference answer: " in out
    assert list(tmp_path.iterdir()) == [tmp_path / "mine.jsonl"]


def test_a_run_records_the_hone_version_in_its_config(tmp_path: Path, micro_model_dir: Path) -> None:
    from tests.helpers import tiny_run

    assert main(["train", *tiny_run(tmp_path, micro_model_dir, "v", **{"run.steps": 0})]) == 0
    text = (tmp_path / "v" / "config.yaml").read_text()
    assert text.splitlines()[0] == f"# hone run config · {version_line()}"
    assert load_config(tmp_path / "v" / "config.yaml").run.name == "v"


def test_dry_run_of_an_environment_shows_its_first_observation_and_tools(
    micro_model_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["train", "--dry-run", "env.name=tool_arithmetic", f"model.path={micro_model_dir}"]
    assert main([*args, "reward.fn=env", "data.train_size=4", "data.eval_size=2", f"run.dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- training prompt") == 2
    tools = [line for line in out.splitlines() if line.startswith("tools the policy can call: ")]
    assert len(tools) == 2 and tools[0] != "tools the policy can call: none"
    assert "[user]" in out and not list(tmp_path.iterdir())

"""Recipes, dotted overrides and their error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from hone.config import ConfigError, find_recipe, list_recipes, load_config, parse_override


def test_default_recipe_loads_and_is_embedded() -> None:
    cfg = load_config()
    assert "default" in list_recipes()
    assert cfg.algorithm.advantage == "grpo" and cfg.sft.enabled
    assert find_recipe(None).is_file()


def test_overrides_are_typed_by_yaml_and_nested() -> None:
    cfg = load_config(
        None,
        [
            "algorithm.advantage=rloo",
            "rollout.n=4",
            "algorithm.kl.coef=0.01",
            'rollout.stop=["\\n"]',
            "model.lora.r=8",
        ],
    )
    assert cfg.algorithm.advantage == "rloo"
    assert cfg.rollout.n == 4 and isinstance(cfg.rollout.n, int)
    assert cfg.algorithm.kl.coef == pytest.approx(0.01)
    assert cfg.rollout.stop == ["\n"]
    assert cfg.model.lora is not None and cfg.model.lora.r == 8


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.advantge=rloo", "algorithm.advantge: unknown key"),
        ("algorithm.advantage=ppo2", "unknown advantage estimator 'ppo2'"),
        ("algorithm.policy_loss=foo", "unknown policy loss 'foo'"),
        ("algorithm.kl.estimator=k9", "unknown KL estimator 'k9'"),
        ("algorithm.loss_agg=mean", "unknown loss aggregation 'mean'"),
        ("rollout.n=many", "rollout.n: Input should be a valid integer"),
        ("trainer.lr=0", "trainer.lr: Input should be greater than 0"),
        ("data.source=x.jsonl", "exactly one of data.task"),
        ("runn.seed=1", "runn: unknown key"),
        ("run.seed", "not of the form section.key=value"),
    ],
)
def test_bad_overrides_fail_with_one_line_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    text = str(info.value)
    assert message in text and "\n" not in text


def test_recipe_file_typo_names_the_file(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("trainer:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"r\.yaml: trainer\.learning_rate: unknown key"):
        load_config(recipe)
    with pytest.raises(ConfigError, match="recipe not found: nope"):
        load_config("nope")


def test_resolved_config_round_trips_through_yaml(tmp_path: Path) -> None:
    cfg = load_config(None, ["algorithm.dual_clip=3.0", "eval.k=[1,4]"])
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    assert load_config(saved) == cfg


def test_parse_override_value_types() -> None:
    assert parse_override("a.b=1e-3") == (["a", "b"], 1e-3)
    assert parse_override("a.b=null") == (["a", "b"], None)
    assert parse_override("a.b=true") == (["a", "b"], True)

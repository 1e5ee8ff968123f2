"""Recipes, dotted overrides and their error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from hone.algorithms import ADVANTAGE_ESTIMATORS
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
        ("data.source=x.jsonl", "only one of data.task"),
        ("data.task=null", "or an env that makes its own"),
        ("env.max_turns=0", "env.max_turns: Input should be greater than or equal to 1"),
        ("runn.seed=1", "runn: unknown key"),
        ("run.seed", "not of the form section.key=value"),
        ("algorithm.advantage=gae", "needs a critic"),
        ("rollout.temperature=0", "rollout.temperature: Input should be greater than 0"),
        ("model.device=gpu", "model.device: String should match pattern"),
        ("run.plugins=[no_such_module_xyz]", "run.plugins: cannot import 'no_such_module_xyz'"),
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


def test_dual_clip_is_rejected_for_losses_that_ignore_it() -> None:
    assert load_config(None, ["algorithm.policy_loss=gspo"]).algorithm.loss_agg is None  # the loss's own
    with pytest.raises(ConfigError, match="dual_clip applies to the 'ppo' loss only"):
        load_config(None, ["algorithm.policy_loss=gspo", "algorithm.dual_clip=3"])


def test_plugins_are_imported_before_names_are_checked() -> None:
    if "plugin_sign" not in ADVANTAGE_ESTIMATORS:  # not yet imported by this test process
        with pytest.raises(ConfigError, match="unknown advantage estimator 'plugin_sign'"):
            load_config(None, ["algorithm.advantage=plugin_sign"])
    cfg = load_config(None, ["run.plugins=[tests.plugin_for_tests]", "algorithm.advantage=plugin_sign"])
    assert cfg.algorithm.advantage == "plugin_sign"

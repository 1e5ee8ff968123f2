"""`algorithm.advantage_args`: an estimator's own hyperparameters, checked against its signature when the
recipe loads; and the newcomer's path it opens: a plugin estimator with a new hyperparameter and a new
batch input is one file (`tests/estimator_plugin_for_tests.py`), with no `AlgorithmConfig` field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hone.algorithms import BATCH_INPUT_BUILDERS, register_batch_input
from hone.algorithms.advantages import built_inputs, hyperparameters
from hone.config import ConfigError, load_config
from hone.rl.loop import train
from hone.training.advantages import compute_advantages, estimator_settings
from hone.types import Rollout
from tests.helpers import tiny_overrides

PLUGIN = "run.plugins=[tests.estimator_plugin_for_tests]"


def _recipe(tmp_path: Path, args: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "run:\n  plugins: [tests.estimator_plugin_for_tests]\n"
        "data:\n  task: arithmetic\n"
        "reward:\n  fn: tests.rewards_for_tests:token_id_reward\n"  # a gradient at every step
        f"algorithm:\n  advantage: length_bonus\n  advantage_args: {args}\n"
    )
    return path


def test_a_plugin_estimators_own_hyperparameter_and_input_reach_it(tmp_path: Path) -> None:
    cfg = load_config(_recipe(tmp_path, "{bonus: 0.5}"), [])
    from tests import estimator_plugin_for_tests as plugin  # imported by run.plugins above

    assert hyperparameters("length_bonus") == {"bonus"}  # the registered input is not a hyperparameter
    assert built_inputs("length_bonus") == {"response_tokens"}
    assert cfg.algorithm.advantage_args == {"bonus": 0.5}
    rollouts = [
        Rollout("s", 0, [5, 6, 7], 1, [1, 1], [0.0, 0.0], reward=1.0),
        Rollout("s", 0, [5, 6, 7], 1, [1, 0], [0.0, 0.0], reward=0.0),
    ]
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    plugin.SEEN.clear()
    advantages, _, _ = compute_advantages(rollouts, cfg.algorithm, response_mask=mask, old_logp=mask * 0)
    assert plugin.SEEN == [{"bonus": 0.5, "response_tokens": [2.0, 1.0]}]
    assert advantages.tolist() == [[2.0, 2.0], [0.5, 0.0]]  # score + 0.5 per response token


def test_a_one_step_run_calls_the_plugin_estimator_with_its_args(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    overrides = tiny_overrides(tmp_path, micro_model_dir, "plugin", **{"run.steps": 1, "run.eval_every": 0})
    cfg = load_config(_recipe(tmp_path, "{bonus: 0.25}"), overrides)
    from tests import estimator_plugin_for_tests as plugin

    plugin.SEEN.clear()
    train(cfg)
    assert [seen["bonus"] for seen in plugin.SEEN] == [0.25]  # one step, one batch
    assert len(plugin.SEEN[0]["response_tokens"]) == 16  # 4 prompts x 4 samples
    saved = (tmp_path / "plugin" / "config.yaml").read_text()
    assert "advantage_args:\n    bonus: 0.25" in saved  # the run records what its estimator was given
    rows = [json.loads(line) for line in (tmp_path / "plugin" / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/policy" in row for row in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            "{bonsu: 0.5}",
            r"recipe\.yaml: algorithm\.advantage_args: advantage estimator 'length_bonus' has no "
            r"hyperparameter 'bonsu'; it accepts bonus$",
        ),
        ("{response_tokens: 1}", r"has no hyperparameter 'response_tokens'; it accepts bonus$"),
    ],
)
def test_a_typo_in_advantage_args_fails_in_one_line(tmp_path: Path, args: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_config(_recipe(tmp_path, args), [])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.advantage_args.gamma=0.5"],
            r"advantage_args: advantage estimator 'grpo' has no hyperparameter 'gamma'; it accepts std_over "
            r"\(eps, norm_by_std: algorithm keys\)$",
        ),
        (
            ["algorithm.advantage=gae", "critic={}", "algorithm.advantage_args.lam=0.5"],
            r"algorithm\.advantage_args: 'lam' is algorithm\.lam: set it there \(one key per value\)$",
        ),
    ],
)
def test_a_hyperparameter_with_its_own_key_is_set_in_one_place(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.advantage_args.std_over=btach"],
            r"algorithm\.advantage_args\.std_over: 'btach' is not one of group, batch \(advantage estimator "
            r"'grpo'\)$",
        ),
        (
            ["algorithm.advantage_args.std_over=batch", "algorithm.norm_by_std=false"],
            r"algorithm\.advantage_args\.std_over: batch needs algorithm\.norm_by_std: true$",
        ),
    ],
)
def test_a_choice_outside_the_estimators_literal_fails_at_load(overrides: list[str], message: str) -> None:
    # a misspelt choice would otherwise reach the estimator only at the first step, after the model loads
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
    settings = estimator_settings(load_config(None, ["algorithm.advantage_args.std_over=batch"]).algorithm)
    assert settings == {"eps": 1e-6, "norm_by_std": True, "std_over": "batch"}


def test_a_built_in_estimators_unkeyed_hyperparameter_is_an_advantage_arg() -> None:
    cfg = load_config(None, ["algorithm.advantage=gae", "critic={}", "algorithm.advantage_args.whiten=true"])
    assert estimator_settings(cfg.algorithm) == {"gamma": 1.0, "lam": 1.0, "eps": 1e-6, "whiten": True}
    assert estimator_settings(load_config(None, []).algorithm) == {"eps": 1e-6, "norm_by_std": True}


def test_a_control_run_refuses_advantage_args() -> None:
    # for grpo (the language-model default) it fails its signature; set at all, it is a language-model key
    with pytest.raises(ConfigError, match=r"algorithm\.advantage_args"):
        load_config("cartpole-ppo", ["algorithm.advantage_args.whiten=true"])


def test_a_batch_input_cannot_shadow_a_built_in_one() -> None:
    with pytest.raises(ValueError, match="batch input 'values' is built in"):
        register_batch_input("values")
    assert "values" not in BATCH_INPUT_BUILDERS

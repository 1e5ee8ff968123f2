"""Recipes, dotted overrides and their error messages."""

from __future__ import annotations

import logging
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
    cfg = load_config(None, ["algorithm.dual_clip=3.0", "eval.n=4", "eval.k=[1,4]"])
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


def test_k1_in_the_loss_is_rejected_because_its_expected_gradient_is_zero() -> None:
    with pytest.raises(ConfigError, match="estimator 'k1' in the loss has zero expected gradient") as info:
        load_config(None, ["algorithm.kl.coef=0.1", "algorithm.kl.estimator=k1"])
    assert "\n" not in str(info.value)
    assert load_config(None, ["algorithm.kl.estimator=k1"]).algorithm.kl.coef == 0  # no KL at all: fine
    reward = ["algorithm.kl.coef=0.1", "algorithm.kl.estimator=k1", "algorithm.kl.placement=reward"]
    assert load_config(None, reward).algorithm.kl.placement == "reward"  # k1's value is what a reward uses


def test_plugins_are_imported_before_names_are_checked() -> None:
    if "plugin_sign" not in ADVANTAGE_ESTIMATORS:  # not yet imported by this test process
        with pytest.raises(ConfigError, match="unknown advantage estimator 'plugin_sign'"):
            load_config(None, ["algorithm.advantage=plugin_sign"])
    cfg = load_config(None, ["run.plugins=[tests.plugin_for_tests]", "algorithm.advantage=plugin_sign"])
    assert cfg.algorithm.advantage == "plugin_sign"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run:\n  name: [a\n  seed: 1\n", r"r\.yaml:3:7: not valid YAML: expected ',' or '\]'"),
        ("", r"r\.yaml: empty recipe; start from a packaged one"),
        ("# every line commented out\n", r"r\.yaml: empty recipe"),
        ("run: 5\n", r"r\.yaml: section 'run' must be a mapping of keys, not 5"),
        ("- run\n", r"r\.yaml: a recipe must be a mapping of sections"),
    ],
)
def test_unusable_recipe_file_is_one_line_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(recipe)
    assert "\n" not in str(info.value)


def test_section_with_every_key_commented_out_takes_its_defaults(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("trainer:\n  # lr: 0.1\nrun:\n  steps: 3\n")
    cfg = load_config(recipe, ["trainer.lr=0.5"])
    assert cfg.run.steps == 3 and cfg.trainer.lr == 0.5


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def broken(:\n", "SyntaxError: "),
        ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
    ],
)
def test_plugin_failing_as_it_is_imported_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, message: str
) -> None:
    (tmp_path / "h7_failing_plugin.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load_config(None, ["run.plugins=[h7_failing_plugin]"])
    text = str(info.value)
    assert text.startswith("run.plugins: cannot import 'h7_failing_plugin': ") and message in text
    assert "\n" not in text


@pytest.mark.parametrize("overrides", [["eval.k=[1,8]"], ["eval.n=4", "eval.k=[1,8]"], ["eval.k=[0]"]])
def test_pass_at_k_beyond_the_samples_drawn_is_an_error(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"eval: k=\[\d\]: pass@k needs 1 <= k <= eval.n"):
        load_config(None, overrides)
    assert load_config(None, ["eval.n=8", "eval.k=[1,8]"]).eval.k == [1, 8]


def test_evaluate_refuses_pass_at_k_beyond_n_before_sampling() -> None:
    from hone.rl.evaluate import evaluate
    from hone.types import SamplingParams

    # Nothing is sampled: the sampler, tokenizer and reward are never touched.
    with pytest.raises(ValueError, match=r"got k=\[1, 8\], n=1"):
        evaluate(None, None, [], None, SamplingParams(n=1), ks=[1, 8])  # type: ignore[arg-type]


def test_override_below_a_null_section_fills_it(tmp_path: Path) -> None:
    saved = tmp_path / "config.yaml"  # what a run directory holds: `lora: null` written out
    saved.write_text(load_config().to_yaml())
    cfg = load_config(saved, ["model.lora.r=4"])
    assert cfg.model.lora is not None and cfg.model.lora.r == 4


def test_a_sampler_dtype_is_for_an_engine_that_casts_its_weights() -> None:
    assert load_config(None, ["rollout.dtype=bfloat16"]).rollout.dtype == "bfloat16"
    casts = r"rollout\.dtype: bfloat16 needs an engine that casts its weights \(hf\); the vllm engine"
    with pytest.raises(ConfigError, match=casts):
        load_config(None, ["rollout.dtype=bfloat16", "rollout.engine=vllm"])


@pytest.mark.parametrize("name", list_recipes())
def test_every_packaged_recipe_validates(name: str) -> None:
    cfg = load_config(name, [])
    assert cfg.run.name  # a recipe names its runs


def test_placement_keys_once_in_trainer_are_read_from_there_once_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`trainer.mode`, `trainer.producers`... moved to `cluster` (the placement layer reads them): the old
    spelling still works in a recipe and in an override, with one warning line naming the new key."""
    recipe = tmp_path / "old.yaml"
    recipe.write_text("trainer: {mode: async, producers: 2, lr: 0.001}\ncluster: {max_staleness: 1}\n")
    with caplog.at_level(logging.WARNING, logger="hone"):
        cfg = load_config(recipe, ["trainer.max_staleness=3"])  # an override in the old spelling still wins
    (record,) = [r for r in caplog.records if "keys have moved" in r.message]
    assert "\n" not in record.message
    for key in ("mode", "producers", "max_staleness"):
        assert f"trainer.{key} -> cluster.{key}" in record.message
    assert (cfg.cluster.mode, cfg.cluster.producers, cfg.cluster.max_staleness) == ("async", 2, 3)
    assert cfg.trainer.lr == 0.001 and "mode" not in cfg.trainer.model_dump()
    assert "mode: async" in cfg.to_yaml() and load_config(recipe).cluster == cfg.cluster.model_copy(
        update={"max_staleness": 1}
    )
    recipe.write_text("trainer: {mode: async}\ncluster: {mode: sync}\n")  # which one is meant cannot be known
    with pytest.raises(
        ConfigError, match=r"trainer\.mode and cluster\.mode are both set .*: keep cluster\.mode$"
    ):
        load_config(recipe)
    with pytest.raises(ConfigError, match=r"cluster: producers=2 needs mode: async"):
        load_config(None, ["trainer.producers=2"])


@pytest.mark.parametrize(
    ("recipe", "says"),
    [
        (
            "nosuch.yaml",
            "recipe not found: nosuch.yaml (no such file, nor a packaged recipe; hone train --help",
        ),
        ("cartpol", "(no packaged recipe of that name; closest: cartpole-ppo; hone train --help lists"),
        ("trainer.lr", "trainer.lr looks like a setting; settings are section.key=value words"),
    ],
)
def test_a_recipe_not_found_names_the_closest_and_where_the_list_is(recipe: str, says: str) -> None:
    """Issue 51: not a ~470-character line of every packaged recipe, but the near names and the command."""
    with pytest.raises(ConfigError) as e:
        load_config(recipe)
    assert says in str(e.value) and len(str(e.value)) < 200

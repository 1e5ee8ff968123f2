"""Rewards chosen by name in a recipe: single built-ins, weighted combinations, plug-ins by dotted
path, and one-line errors for names and arguments that can't work."""

from __future__ import annotations

from pathlib import Path

import pytest

from hone.config import ConfigError, load_config
from hone.data import get_task
from hone.rewards import scoring
from hone.rewards.resolve import load_reward, reward_correctness_component
from hone.types import Rollout, Sample


def rollout(text: str, sample_id: str = "s", response_len: int = 4) -> Rollout:
    return Rollout(sample_id, 0, [0] * (2 + response_len), 2, [1] * response_len, [0.0] * response_len, text)


SAMPLES = {"s": Sample("s", prompt="What is 6*7?", answer="42")}


def test_a_built_in_reward_by_name_with_args() -> None:
    cfg = load_config(None, ["reward.fn=math", "reward.timeout_s=5"])
    scorer = load_reward(cfg.reward, None)
    rollouts = [rollout("so \\boxed{42}"), rollout("the answer is 41"), rollout("I don't know")]
    metrics = scorer.score(rollouts, SAMPLES)
    assert [r.reward for r in rollouts] == [1.0, 0.0, 0.0] and metrics["reward/errors"] == 0.0
    assert scorer.timeout_s == 5


def test_weighted_components_from_a_recipe_file(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "reward:\n"
        "  components:\n"
        "    correct: {fn: math}\n"
        "    format: {fn: format, weight: 0.2, args: {pattern: '<answer>.*</answer>'}}\n"
        "    overlong: {fn: overlong, args: {max_len: 8, buffer: 4}}\n"
    )
    scorer = load_reward(load_config(recipe).reward, None)
    rollouts = [
        rollout("<answer>42</answer>", response_len=4),  # right, formatted, short
        rollout("42", response_len=6),  # right, unformatted, 2 tokens into the 4-token buffer: -0.5
        rollout("<answer>7</answer>", response_len=9),  # wrong, formatted, over max_len: -1
    ]
    metrics = scorer.score(rollouts, SAMPLES)
    assert [r.reward for r in rollouts] == pytest.approx([1.2, 0.5, -0.8])
    assert rollouts[1].reward_parts == {"correct": 1.0, "format": 0.0, "overlong": -0.5}
    assert metrics["reward/correct"] == pytest.approx(2 / 3) and metrics["reward/overlong"] == pytest.approx(
        -0.5
    )


def test_the_task_reward_is_the_default_and_needs_a_task() -> None:
    cfg = load_config(None, ["reward.fn=null"])
    scorer = load_reward(cfg.reward, get_task("arithmetic"))
    assert [c.name for c in scorer.components] == ["task"]
    with pytest.raises(ValueError, match=r"needs data\.task"):
        load_reward(cfg.reward, None)


@pytest.mark.parametrize(
    ("task", "overrides", "rewards"),
    [
        # the arithmetic tasks declare `math: {require_evaluated: true}`: a sum left undone scores 0
        ("arithmetic", [], [1.0, 0.0, 0.0]),
        ("word_problems", [], [1.0, 0.0, 0.0]),
        # the recipe's args win over the task's
        ("arithmetic", ["reward.args={require_evaluated: false}"], [1.0, 1.0, 1.0]),
        # no task: `math`'s own default, where a closed form equal to the reference is correct
        (None, [], [1.0, 1.0, 1.0]),
    ],
)
def test_a_task_sets_its_defaults_for_the_math_reward(
    task: str | None, overrides: list[str], rewards: list[float]
) -> None:
    scorer = load_reward(load_config(None, ["reward.fn=math", *overrides]).reward, task and get_task(task))
    samples = {"s": Sample("s", prompt="45+367=", answer="412")}
    rollouts = [rollout("\\boxed{412}"), rollout("\\boxed{45+367}"), rollout("The answer is 400 + 12.")]
    scorer.score(rollouts, samples)
    assert [r.reward for r in rollouts] == rewards


def test_dotted_paths_are_reward_functions_or_factories_with_args() -> None:
    plain = load_reward(load_config(None, ["reward.fn=tests.rewards_for_tests:token_id_reward"]).reward, None)
    assert plain.components[0].name == "token_id_reward"
    factory = load_reward(
        load_config(None, ["reward.fn=hone.rewards.shaping:length_reward", "reward.args={target: 2}"]).reward,
        None,
    )
    rollouts = [rollout("x", response_len=4)]
    factory.score(rollouts, SAMPLES)
    assert rollouts[0].reward == pytest.approx(-0.002)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["reward.fn=maths"], "unknown reward; built-in: code, env, format"),
        (["reward.fn=format", "reward.args={patern: x}"], "bad args"),
        (["reward.fn=format", "reward.args={pattern: '('}"], "pattern"),
        (["reward.fn=no.such.module:fn"], "cannot import 'fn' from 'no.such.module'"),
    ],
)
def test_bad_reward_names_and_args_fail_with_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_reward(load_config(None, overrides).reward, None)


def test_fn_and_components_are_exclusive() -> None:
    with pytest.raises(ConfigError, match=r"either reward\.fn or reward\.components"):
        load_config(None, ["reward.fn=math", "reward.components={a: {fn: math}}"])


@pytest.mark.parametrize(
    ("components", "expected"),
    [
        (
            "{fmt: {fn: format}, correct: {fn: math}, long: {fn: overlong, args: {max_len: 8, buffer: 4}}}",
            "correct",
        ),
        (
            "{fmt: {fn: format}, mine: {fn: 'tests.rewards_for_tests:token_id_reward', correctness: true}}",
            "mine",
        ),
        ("{fmt: {fn: format}, long: {fn: overlong, args: {max_len: 8, buffer: 4}}}", None),
        ("{only: {fn: format}}", "only"),
    ],
)
def test_the_correctness_component_is_the_marked_one_else_the_only_one_else_the_first_verifier(
    components: str, expected: str | None
) -> None:
    cfg = load_config(None, ["reward.fn=null", f"reward.components={components}"])
    assert reward_correctness_component(cfg.reward) == expected
    assert load_reward(cfg.reward, None).correctness == expected
    assert reward_correctness_component(load_config(None, ["reward.fn=math"]).reward) == "math"


def test_two_correctness_components_are_refused_at_load() -> None:
    two = "{a: {fn: math, correctness: true}, b: {fn: code, correctness: true}}"
    with pytest.raises(ConfigError, match=r"reward: only one reward component can set correctness"):
        load_config(None, ["reward.fn=null", f"reward.components={two}"])


def test_config_and_scorer_choose_the_correctness_component_by_one_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One function decides, for a recipe and for a scorer built by hand (which knows no verifiers)."""
    seen: list[tuple[list[str], list[str], list[str]]] = []

    def rule(names: list[str], marked: list[str], verifiers: list[str] | tuple[()] = ()) -> str:
        seen.append((list(names), list(marked), list(verifiers)))
        return "decided"

    monkeypatch.setattr(scoring, "correctness_component", rule)
    cfg = load_config(None, ["reward.fn=null", "reward.components={fmt: {fn: format}, right: {fn: math}}"])
    assert reward_correctness_component(cfg.reward) == "decided"
    assert scoring.RewardScorer([scoring.RewardComponent("x", lambda r, s: 1.0)]).correctness == "decided"
    assert seen == [(["fmt", "right"], [], ["right"]), (["x"], [], [])]

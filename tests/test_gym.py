"""reasoning-gym as a data source: loading offline, its verifier as the task reward, train/eval
disjointness, composite weights, one-line errors, and a short RL run on the tiny model."""

from __future__ import annotations

import json
import logging
import socket
from collections import Counter
from pathlib import Path

import pytest

from hone.config import ConfigError, load_config
from hone.data import HoneDataError
from hone.data.gym import ReasoningGymTask, extract_answer
from hone.rewards.resolve import load_reward
from hone.rl.loop import SetupError, train
from tests.helpers import run_splits, tiny_overrides

pytest.importorskip("reasoning_gym")

ONE_DIGIT_SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # 200 problems


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("reasoning-gym tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_answer_extraction_prefers_the_last_answer_tag_else_the_first_line() -> None:
    assert extract_answer("think 3\n<answer>4</answer> or <answer> 5 </answer>") == "5"
    assert extract_answer(" 12 \nmore text") == "12"
    assert extract_answer("7<eos>junk") == "7"


def off_by_one(answer: str | None) -> str:
    """A wrong answer that does not contain the right one: reasoning-gym gives partial credit for that
    ("-1234" scores 0.75 against "-12")."""
    return str(int(answer or "0") + 1)


@pytest.mark.parametrize(
    ("name", "args"),
    [("chain_sum", {}), ("basic_arithmetic", {"min_terms": 2, "max_terms": 3}), ("letter_counting", {})],
)
def test_tasks_load_offline_and_score_right_and_wrong_answers(
    no_network: None, name: str, args: dict[str, object]
) -> None:
    task = ReasoningGymTask(name, args)
    train_set = task.train_samples(20, seed=1)
    assert len(train_set) == 20 and all(s.prompt and s.answer for s in train_set)
    assert train_set[0].id == f"reasoning_gym:{name}-train-1-0"
    for sample in train_set[:5]:
        assert task.reward(sample.answer or "", sample) == 1.0
        assert task.reward(f"I think so.\n<answer>{sample.answer}</answer>", sample) == 1.0
        assert task.reward(off_by_one(sample.answer), sample) == 0.0
        assert task.reward(f"<answer>{off_by_one(sample.answer)}</answer>\n{sample.answer}", sample) == 0.0
        assert task.reward(task.demonstration(sample), sample) == 1.0  # SFT demonstrations are correct


def test_the_same_seed_gives_the_same_problems_and_eval_uses_another_stream() -> None:
    a, b = ReasoningGymTask("chain_sum", {}), ReasoningGymTask("chain_sum", {})
    assert [s.prompt for s in a.train_samples(30, seed=0)] == [s.prompt for s in b.train_samples(30, seed=0)]
    from_a = a.train_samples(3, seed=5)[2]  # scored by an instance that never drew from that seed
    assert b.reward(from_a.answer or "", from_a) == 1.0 and b.reward(off_by_one(from_a.answer), from_a) == 0.0
    # run.seed 0 and EVAL_SEED 0 are different reasoning-gym seeds
    assert {s.prompt for s in a.eval_samples(30, seed=0)} != {s.prompt for s in a.train_samples(30, seed=0)}


def test_eval_problems_that_are_training_problems_are_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = ReasoningGymTask("chain_sum", ONE_DIGIT_SUMS)
    train_questions = {s.prompt for s in task.train_samples(150, seed=0)}
    with caplog.at_level(logging.WARNING, logger="hone"):
        held_out = task.eval_samples(20, seed=0, at_most=True)
    assert held_out and not {s.prompt for s in held_out} & train_questions
    assert len({s.prompt for s in held_out}) == len(held_out)  # distinct
    assert "dropped" in caplog.text and "eval problems that are training problems" in caplog.text
    with pytest.raises(HoneDataError, match=r"found only \d+ eval problems of 150"):
        task.eval_samples(150, seed=0)


def test_training_problems_avoid_the_eval_set_when_drawn_after_it() -> None:
    """SFT demonstrations are drawn after the eval set (seed run.seed + 7): they must not teach it."""
    task = ReasoningGymTask("chain_sum", ONE_DIGIT_SUMS)
    eval_questions = {s.prompt for s in task.eval_samples(30, seed=0)}
    assert not eval_questions & {s.prompt for s in task.train_samples(100, seed=7)}


def test_a_composite_mixes_tasks_by_weight_and_scores_each_with_its_own_verifier() -> None:
    task = ReasoningGymTask(
        "composite",
        {
            "datasets": {
                "chain_sum": {"weight": 3},
                "letter_counting": {"weight": 1, "config": {"min_words": 3, "max_words": 5}},
            }
        },
    )
    samples = task.train_samples(800, seed=0)
    counts = Counter(s.meta["metadata"]["source_dataset"] for s in samples)
    assert 0.68 < counts["chain_sum"] / len(samples) < 0.82  # 3:1 → 0.75
    for source in ("chain_sum", "letter_counting"):
        sample = next(s for s in samples if s.meta["metadata"]["source_dataset"] == source)
        assert task.reward(sample.answer or "", sample) == 1.0
        assert task.reward(off_by_one(sample.answer), sample) == 0.0


@pytest.mark.parametrize(
    ("name", "args", "error"),
    [
        ("chain_summ", {}, r"^unknown reasoning-gym task 'chain_summ'; e\.g\. chain_sum"),
        ("chain_sum", {"max_term": 3}, r"^data\.args\.max_term: not a setting of .*max_terms"),
        ("chain_sum", {"size": 3}, r"^data\.args\.size: set by data\.train_size"),
        ("chain_sum", {"min_terms": 5, "max_terms": 2}, r"^data\.args for .*max_terms must be >= min"),
        ("composite", {}, r"^data\.args\.datasets: reasoning_gym:composite needs"),
        (
            "composite",
            {"datasets": {"chain_sum": {"weight": 1, "config": {"digits": 2}}}},
            r"^data\.args\.datasets\.chain_sum\.config\.digits: not a setting",
        ),
        ("composite", {"datasets": {"chain_sum": {"weight": -1}}}, r"chain_sum\.weight must be a positive"),
        ("composite", {"datasets": {"nope": {}}}, r"^unknown reasoning-gym task 'nope'"),
    ],
)
def test_bad_names_and_args_are_one_line_errors_naming_the_key(
    name: str, args: dict[str, object], error: str
) -> None:
    with pytest.raises(HoneDataError, match=error) as caught:
        ReasoningGymTask(name, args)
    assert "\n" not in str(caught.value)


def test_the_config_wires_the_source_to_the_task_reward(micro_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(
        None,
        tiny_overrides(
            tmp_path,
            micro_model_dir,
            "wiring",
            **{"data.task": "null", "data.source": "reasoning_gym:chain_sum", "reward.fn": "task"},
        ),
    )
    task, train_set, eval_set = run_splits(cfg)
    assert isinstance(task, ReasoningGymTask) and len(train_set) == 64 and len(eval_set) == 16
    assert not {s.prompt for s in train_set} & {s.prompt for s in eval_set}
    scorer = load_reward(cfg.reward, task)
    assert scorer.components[0].correctness
    with pytest.raises(ConfigError, match=r"data\.args is the config of data\.source reasoning_gym"):
        load_config(None, ["data.args={min_terms: 2}"])  # on the default arithmetic task: refused


def test_a_short_rl_run_on_a_reasoning_gym_task(tmp_path: Path, micro_model_dir: Path) -> None:
    overrides = {
        "data.task": "null",
        "data.source": "reasoning_gym:chain_sum",
        "data.args": "{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}",
        "reward.fn": "task",
        "run.steps": 2,
        "run.eval_every": 0,
        "sft.enabled": "true",
        "sft.max_steps": 2,
        "sft.examples": 32,
        "sft.val_size": 8,
    }
    train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "gym", **overrides)))
    rows = [json.loads(line) for line in (tmp_path / "gym" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    assert "eval/accuracy" in rows[-1]
    bad = {**overrides, "data.args": "{max_term: 3}"}
    with pytest.raises(SetupError, match=r"data\.args\.max_term"):
        train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "gym-bad", **bad)))

"""Runs that say what they did (issue 31): the end summary's policy-update and no-signal counts (against
state.json), the warning when nothing was learned, the resumed summary's labels, a reward that raises on
every step-0 eval response stopping the run, eval leaving reward and environment failures out of
accuracy, `logging.samples` (samples.jsonl and TensorBoard text), and `hone eval --run`. Tiny model."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from hone.cli import main
from hone.envs import Environment, StepResult
from hone.rewards import RewardScorer
from hone.rewards.env import env_reward
from hone.rl.evaluate import evaluate
from hone.rollout.multiturn import EpisodeLimits, Episodes
from hone.tracking import read_metrics, read_samples
from hone.training.policy import Policy
from hone.types import Rollout, Sample, SamplingParams
from tests.helpers import FixedSampler, PlainTokenizer, Scripted, tiny_run

TOKEN_REWARD = "tests.rewards_for_tests:token_id_reward"  # differs within almost every group
SAMPLE_KEYS = {
    "step",
    "sample_id",
    "prompt",
    "response",
    "finish_reason",
    "reward",
    "reward_parts",
    "meta",  # the sample's meta (arithmetic's operands)
    "reward_failed",
    "advantage",
    "policy_version",
}


def _updates(run: Path, step: int) -> int:
    state = json.loads((run / "checkpoints" / f"step-{step}" / "state.json").read_text())
    return int(state["trainer"]["updates"])


def test_a_run_with_only_equal_reward_groups_says_so_and_warns_loudly(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The micro model never answers an addition: every group's rewards are 0, every group is skipped
    (the default recipe's skip_zero_variance_groups), and nothing trains; the run still exits 0."""
    args = tiny_run(tmp_path, micro_model_dir, **{"logging.progress": "true"})
    assert main(["train", *args]) == 0
    out, err = capsys.readouterr()
    assert _updates(tmp_path / "r", 2) == 0
    assert "0 of 2 steps updated the policy; 2 steps had only equal-reward groups (no signal)" in out
    assert "updated 0/2" in out  # the progress line
    warning = err[err.index("WARNING") :].splitlines()
    assert len(warning) > 3 and "rewards were all equal" in err
    assert "sft.enabled" in err and "logging.samples" in err
    rows = read_metrics(tmp_path / "r" / "metrics.jsonl")
    assert [(row["train/policy_updated"], row["groups/with_signal"]) for row in rows[1:]] == [(0, 0)] * 2


def test_summary_counts_match_state_json_samples_are_logged_and_a_resume_says_where_it_resumed(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {
        "reward.fn": TOKEN_REWARD,
        "logging.progress": "true",
        "logging.tensorboard": "true",
        "logging.samples": 3,
        "run.eval_every": 1,
    }
    run = tmp_path / "r"
    assert main(["train", *tiny_run(tmp_path, micro_model_dir, **settings)]) == 0
    out, err = capsys.readouterr()
    updated = _updates(run, 2)
    assert updated >= 1 and "WARNING" not in err
    assert f"{updated} of 2 steps updated the policy; {2 - updated} step" in out
    assert f"updated {updated}/2" in out and "held-out accuracy before RL" in out

    records = read_samples(run / "samples.jsonl")
    assert [r["step"] for r in records] == [1, 1, 1, 2, 2, 2]  # the first 3 of each step's 4 rollouts
    assert all(set(r) == SAMPLE_KEYS for r in records)
    assert {r["finish_reason"] for r in records} <= {"stop", "length"}
    assert all(r["prompt"].endswith("=") and isinstance(r["reward"], float) for r in records)
    trained = [r for r in records if r["advantage"] is not None]
    assert trained and all(isinstance(r["advantage"], float) for r in trained)
    assert (
        len({r["sample_id"] for r in records if r["step"] == 1}) <= 2
    )  # first in the batch: one group first

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors("samples/text_summary")
    assert [t.step for t in texts] == [1, 2]
    first = texts[0].tensor_proto.string_val[0].decode()
    assert first.count("**sample ") == 3 and f"reward {records[0]['reward']:.4g}" in first
    assert f"finish {records[0]['finish_reason']}" in first

    # Killed after step 2 was logged but before its checkpoint: the resume redoes step 2 and drops its rows.
    shutil.rmtree(run / "checkpoints" / "step-2")
    assert main(["train", "--resume", str(run), "run.steps=3"]) == 0
    out, _ = capsys.readouterr()
    total = _updates(run, 3)
    assert f"RL steps        3   ({total} of 3 steps updated the policy;" in out
    assert "held-out accuracy at resume (step 1)" in out and "points since step 1" in out
    assert "held-out accuracy before RL" in out
    assert [r["step"] for r in read_samples(run / "samples.jsonl")] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_a_reward_that_raises_on_every_step_0_eval_response_stops_the_run(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = tiny_run(tmp_path, micro_model_dir, **{"reward.fn": "tests.rewards_for_tests:always_raises"})
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        "hone: error: reward raised on every one of the 4 step-0 eval samples (a bug in the reward, not an "
        "outage): AttributeError: 'Rollout' object has no attribute 'no_such_field'; traceback in "
    )
    traceback = (tmp_path / "r" / "errors" / "reward.txt").read_text()
    assert "Traceback" in traceback and "no_such_field" in traceback
    assert not (tmp_path / "r" / "checkpoints").exists()
    assert read_metrics(tmp_path / "r" / "metrics.jsonl")[0]["eval/errors"] == 4


class DownForSome(Environment):
    """Answers every first turn with reward 1, but its server is down for samples marked `down`."""

    def reset(self, sample: Sample) -> list[dict[str, str]]:
        self.down = sample.meta["down"]
        return [{"role": "user", "content": "go"}]

    def step(self, assistant_message: str) -> StepResult:
        if self.down:
            raise ConnectionError("server down")
        return StepResult([], 1.0, True)


def test_eval_counts_environment_failures_apart_instead_of_grading_them_wrong(micro_model_dir: Path) -> None:
    tokenizer = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    samples = [Sample(str(i), prompt="go", meta={"down": i % 2 == 1}) for i in range(4)]
    metrics = evaluate(
        Scripted(tokenizer, ["42"]),  # type: ignore[arg-type]
        tokenizer,
        samples,
        env_reward(),
        SamplingParams(n=1, max_new_tokens=4),
        episodes=Episodes(DownForSome, EpisodeLimits(max_turns=1, max_tokens_per_turn=4)),
    )
    assert metrics["eval/env/errors"] == 2 and metrics["eval/scored"] == 2
    assert metrics["eval/accuracy"] == 1.0 and metrics["eval/pass@1"] == 1.0  # not 0.5: failures say nothing


def test_eval_leaves_failed_rewards_out_of_accuracy_and_pass_at_k() -> None:
    def grade(rollout: Rollout, sample: Sample) -> float:
        if rollout.response_text == "boom":
            raise RuntimeError("verifier crashed")
        return float(rollout.response_text == "42")

    texts = {"a": ["42", "boom", "7"], "b": ["boom", "boom", "boom"]}

    def respond(request: object, params: SamplingParams) -> list[Rollout]:
        sample_id, group = request.sample_id, request.group_id  # type: ignore[attr-defined]
        return [Rollout(sample_id, group, [0, 0, 5], 2, [1], [0.0], text) for text in texts[sample_id]]

    metrics = evaluate(
        FixedSampler(respond),  # type: ignore[arg-type]
        PlainTokenizer(),  # type: ignore[arg-type]
        [Sample("a", prompt="6*7=", answer="42"), Sample("b", prompt="1+1=", answer="2")],
        RewardScorer(grade),
        SamplingParams(n=3, temperature=1.0),
        ks=[1, 2],
    )
    assert metrics["eval/errors"] == 4 and metrics["eval/scored"] == 2
    assert metrics["eval/accuracy"] == 0.5 and metrics["eval/reward"] == 0.5
    # pass@k over the problems with k scored samples: only "a" (2 scored, 1 right); "b" has none.
    assert metrics["eval/pass@1"] == 0.5 and metrics["eval/pass@2"] == 1.0


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory, micro_model_dir: Path) -> Path:
    """A 2-step run (checkpoints step-1 and step-2) whose recipe differs from the default's: responses of
    at most 2 tokens, 3 eval problems."""
    root = tmp_path_factory.mktemp("short")
    args = tiny_run(root, micro_model_dir, "x", **{"rollout.max_new_tokens": 2, "data.eval_size": 3})
    assert main(["train", *args]) == 0
    return root / "x"


def test_eval_run_uses_the_runs_config_and_its_latest_checkpoint(
    short_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out, samples = tmp_path / "m.json", tmp_path / "samples.jsonl"
    with caplog.at_level(logging.INFO, logger="hone"):
        assert main(["eval", "--run", str(short_run), "--out", str(out), "--samples", str(samples)]) == 0
    assert f"eval: {short_run}/checkpoints/step-2/model with {short_run}/config.yaml" in caplog.text
    metrics = json.loads(out.read_text())
    assert metrics["eval/scored"] == 3 and metrics["eval/response_length"] <= 2  # the run's, not 8
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(records) == 3
    assert set(records[0]) == {
        "sample_id",
        "prompt",
        "response",
        "finish_reason",
        "reward",
        "reward_parts",
        "meta",
        "correct",
        "errors",
    }
    assert all(r["correct"] in (True, False) and not any(r["errors"].values()) for r in records)


def test_eval_run_takes_a_step_and_overrides(
    short_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    samples = tmp_path / "samples.jsonl"
    with caplog.at_level(logging.INFO, logger="hone"):
        code = main(
            ["eval", "--run", str(short_run), "--step", "1", "--samples", str(samples), "data.eval_size=2"]
        )
    assert code == 0 and f"{short_run}/checkpoints/step-1/model with" in caplog.text
    assert len(samples.read_text().splitlines()) == 2


def test_a_model_inside_a_run_is_evaluated_with_that_runs_config(
    short_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, out = short_run / "checkpoints" / "step-1" / "model", tmp_path / "m.json"
    with caplog.at_level(logging.INFO, logger="hone"):
        assert main(["eval", "--model", str(model), "--out", str(out)]) == 0
    said = [r.getMessage() for r in caplog.records if "is inside the run" in r.getMessage()]
    assert said == [
        f"eval: {model} is inside the run {short_run}: using its config.yaml (give a recipe to use another)"
    ]
    metrics = json.loads(out.read_text())
    assert metrics["eval/scored"] == 3 and metrics["eval/response_length"] <= 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["default"], "--run takes the run's own config.yaml; pass overrides only, not a recipe (default)"),
        (["--step", "7"], "--step 7: {run} has no checkpoint step-7 (checkpoints: step-1, step-2)"),
        (["--model", "m"], "--model goes without --run"),
    ],
)
def test_eval_run_refuses_what_does_not_go_with_it_in_one_line(
    short_run: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["eval", "--run", str(short_run), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hone: error: ") and message.format(run=short_run) in err[0]


def test_an_eval_whose_every_reward_raised_is_one_line_not_accuracy_0(
    short_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["eval", "--run", str(short_run), "reward.fn=tests.rewards_for_tests:always_raises"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reward raised on every one of the 3 eval samples" in err[0]


def test_an_update_on_equal_reward_groups_only_does_not_count_as_updating_the_policy() -> None:
    from hone.rl.report import UPDATED, WITH_SIGNAL, StepTally, nothing_learned

    tally = StepTally()
    tally.add({UPDATED: 1.0, WITH_SIGNAL: 0.0})  # skip_zero_variance_groups off: a zero-advantage update
    tally.add({UPDATED: 1.0, WITH_SIGNAL: 2.0})
    tally.add({UPDATED: 0.0, WITH_SIGNAL: 0.0})
    assert (tally.steps, tally.updated, tally.no_signal) == (3, 1, 2)
    assert tally.line() == "1 of 3 steps updated the policy; 2 steps had only equal-reward groups (no signal)"
    assert nothing_learned(tally) is None
    empty = StepTally()
    empty.add({UPDATED: 1.0, WITH_SIGNAL: 0.0})
    assert (warning := nothing_learned(empty)) is not None and "0 of 1 steps updated" in warning

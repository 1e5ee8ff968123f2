"""Prompt curricula: pass-rate tracking, the difficulty filter, the schedulers, and their runs and resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hone.config import DataConfig, DifficultyFilterConfig, load_config
from hone.data.curriculum import Curriculum, build_curriculum
from hone.data.passrates import Outcome, PassRates
from hone.data.schedulers import PromptStream
from hone.rewards.scoring import CORRECTNESS
from hone.rl.loop import Setup, SetupError, train
from hone.rl.outcomes import prompt_outcomes
from hone.rl.producer import Producer, PromptBatch, ScoredGroups
from hone.types import Rollout, Sample
from tests.helpers import assert_same_weights, killed_and_resumed, recording_setup, tiny_overrides


def samples(n: int) -> list[Sample]:
    return [Sample(id=f"t-train-0-{i}", prompt=str(i)) for i in range(n)]


def kind(sample_id: str) -> int:
    """0: always right, 1: always wrong, 2: right half the time (as `prompt_class_reward`)."""
    return int(sample_id.rsplit("-", 1)[1]) % 3


def outcomes_of(batch: list[Sample], n: int = 4) -> dict[str, Outcome]:
    return {s.id: ((n, 0, n // 2)[kind(s.id)], n) for s in batch}


def curriculum(n: int = 30, batch: int = 4, **data: object) -> Curriculum:
    return build_curriculum(DataConfig(prompts_per_step=batch, **data), samples(n), seed=7)  # type: ignore[arg-type]


def test_pass_rate_is_an_ema_of_group_pass_rates_set_by_the_first_group() -> None:
    rates = PassRates(ema=0.5)
    rates.update({"a": (3, 4), "b": (0, 0)})  # b: every reward failed, nothing learnt
    assert rates.rates == {"a": 0.75}
    rates.update({"a": (1, 4)})
    assert rates.rates["a"] == 0.5 * 0.75 + 0.5 * 0.25
    rates.update({"a": (4, 4)})
    assert rates.rates["a"] == 0.75
    assert rates.get(Sample(id="b")) == 0.5  # unseen: the prior
    assert rates.get(Sample(id="c", meta={"pass_rate_prior": 0.2})) == 0.2  # a data source's hint


def test_outcomes_count_correct_rollouts_per_prompt_before_filters_without_failed_rewards() -> None:
    def r(sample_id: str, correct: float, failed: bool = False) -> Rollout:
        metrics = {CORRECTNESS: correct} | ({"reward/error": 1.0} if failed else {})
        return Rollout(sample_id, 0, [1, 2], 1, [1], [0.0], metrics=metrics)

    got = prompt_outcomes([r("a", 1.0), r("a", 0.0), r("a", 1.0, failed=True), r("b", 0.5)])
    assert got == {"a": (1, 2), "b": (0, 1)}  # 0.5 is not full marks


def test_filter_skips_out_of_range_prompts_for_the_cooldown_then_readmits_them() -> None:
    cur = curriculum(6, 2, difficulty_filter=DifficultyFilterConfig(lo=0.1, hi=0.9, cooldown_steps=2))
    assert sorted(s.id for step in range(3) for s in cur.batch(step)) == sorted(s.id for s in samples(6))
    easy, hard, *mid = (s.id for s in samples(6))
    cur.observe(0, {})
    cur.observe(1, {})
    metrics = cur.observe(2, {easy: (4, 4), hard: (0, 4)} | {i: (2, 4) for i in mid})
    assert metrics["prompts/skipped_frac"] == 2 / 6
    for step in (3, 4):  # cooling down: passed over
        batch = cur.batch(step)
        assert len(batch) == 2 and not {easy, hard} & {s.id for s in batch}
        cur.observe(step, {s.id: (2, 4) for s in batch})
    assert not cur.cooldown.skipped(easy, 5) and not cur.cooldown.skipped(hard, 5)  # type: ignore[union-attr]
    readmitted = {s.id for step in range(5, 11) for s in cur.batch(step)}  # 12 draws: a whole epoch
    assert {easy, hard} <= readmitted


def test_filter_never_stalls_when_every_prompt_cools_down() -> None:
    cur = curriculum(3, 2, difficulty_filter=DifficultyFilterConfig(lo=0.1, hi=0.9, cooldown_steps=5))
    cur.observe(0, {s.id: (4, 4) for s in samples(3)})
    assert len(cur.batch(1)) == 2


def test_uniform_scheduler_is_prompt_stream_exactly_whatever_it_observes() -> None:
    cur, stream = curriculum(10, 4), PromptStream(samples(10), 4, seed=7)
    for step in range(8):
        assert cur.batch(step) == stream.batch(step)
        cur.observe(step, outcomes_of(cur.batch(step)))


def _intermediate_share(cur: Curriculum, steps: range, eta: int = 0) -> float:
    """Run `cur` on the `kind` outcomes with steps drawn `eta` ahead (async); the share of kind-2 prompts
    drawn in the second half."""
    drawn = []
    for step in steps:
        for ahead in range(step, step + eta + 1):
            cur.batch(ahead)
        drawn.append(cur.batch(step))
        cur.observe(step, outcomes_of(drawn[-1]))
    late = [s for batch in drawn[len(drawn) // 2 :] for s in batch]
    return sum(kind(s.id) == 2 for s in late) / len(late)


def test_difficulty_scheduler_prefers_intermediate_prompts() -> None:
    # Not all: the fresh half of a batch is the best of a pool that may hold too few intermediate prompts.
    assert _intermediate_share(curriculum(30, 4, scheduler="difficulty"), range(30)) >= 0.9
    assert _intermediate_share(curriculum(30, 4, scheduler="difficulty"), range(30), eta=2) >= 0.9
    assert _intermediate_share(curriculum(30, 4), range(30)) < 0.5  # uniform: about a third


def test_the_fresh_share_keeps_measuring_new_prompts() -> None:
    """Without it the tracked prompts nearest the target are drawn forever; with it new ones keep coming."""
    seen = {}
    for fresh in (0.0, 0.5):
        cur = curriculum(300, 4, scheduler="difficulty", scheduler_args={"fresh": fresh})
        _intermediate_share(cur, range(40))
        seen[fresh] = len(cur.rates.rates)
    assert seen[0.0] < 25 and seen[0.5] > 60  # 18 and 67 when written


def test_difficulty_target_is_lowered_when_batches_pass_above_it() -> None:
    cur = curriculum(30, 4, scheduler="difficulty", scheduler_args={"adapt": 0.5, "ema": 1.0})
    scheduler = cur.scheduler
    assert scheduler.target() == 0.5  # type: ignore[attr-defined]
    cur.observe(0, {"x": (4, 4), "y": (3, 4)})  # the batch passed at 0.875
    assert scheduler.target() == 0.5 - 0.5 * 0.375  # type: ignore[attr-defined]
    cur.observe(1, {"x": (0, 4)})  # below target: back to it
    assert scheduler.target() == 0.5  # type: ignore[attr-defined]


@pytest.mark.parametrize("scheduler", ["uniform", "difficulty", "tests.schedulers_for_tests:LeastSeen"])
def test_state_round_trips_through_json_mid_async_run(scheduler: str) -> None:
    """A copy restored from the JSON of a checkpoint taken with steps drawn ahead but not observed (async,
    η = 2) goes on to draw exactly what the original does."""
    flt = DifficultyFilterConfig(lo=0.1, hi=0.9, cooldown_steps=3)
    make = lambda: curriculum(20, 4, scheduler=scheduler, difficulty_filter=flt)  # noqa: E731
    a = make()
    for step in range(5):
        for ahead in range(step, step + 3):
            a.batch(ahead)
        a.observe(step, outcomes_of(a.batch(step)))
    b = make()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for step in range(5, 15):
        for ahead in range(step, step + 3):
            assert a.batch(ahead) == b.batch(ahead)
        a.observe(step, outcomes_of(a.batch(step)))
        b.observe(step, outcomes_of(b.batch(step)))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nope", "data.scheduler: unknown scheduler 'nope'; built-in: difficulty, uniform"),
        ("tests.nothing_here:X", "data.scheduler: cannot import 'X' from 'tests.nothing_here'"),
        ("tests.schedulers_for_tests:Nope", "data.scheduler: cannot import 'Nope'"),
    ],
)
def test_a_bad_scheduler_is_one_line_naming_the_key(
    tmp_path: Path, micro_model_dir: Path, name: str, message: str
) -> None:
    cfg = load_config(None, tiny_overrides(tmp_path, micro_model_dir, "bad", **{"data.scheduler": name}))
    with pytest.raises(SetupError) as err:
        train(cfg)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert not (tmp_path / "bad").exists()


def test_bad_scheduler_args_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"^data\.scheduler_args: difficulty cannot be built: .*'pol'"):
        curriculum(scheduler="difficulty", scheduler_args={"pol": 3})


def _recorded_run(
    tmp_path: Path,
    model: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    setup: Setup | None = None,
    **extra: object,
) -> list[list[str]]:
    """Train; return the sample ids each step was produced with."""
    produced: list[list[str]] = []
    real = Producer.produce

    def produce(self: Producer, prompts: PromptBatch) -> ScoredGroups:
        produced.append([s.id for s in prompts.samples])
        return real(self, prompts)

    monkeypatch.setattr(Producer, "produce", produce)
    train(
        load_config(None, tiny_overrides(tmp_path, model, name, **{"run.eval_every": 0, **extra})),
        setup=setup,
    )
    return produced


def test_uniform_run_draws_prompt_stream_batches_and_logs_pass_rates(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup, parts = recording_setup()
    produced = _recorded_run(tmp_path, micro_model_dir, monkeypatch, "u", setup, **{"run.steps": 3})
    stream = PromptStream(parts[0].train_samples, 4, seed=load_config(None, []).run.seed)
    assert produced == [[s.id for s in stream.batch(step)] for step in range(3)]
    rows = [json.loads(x) for x in (tmp_path / "u" / "metrics.jsonl").read_text().splitlines()]
    assert all(
        {"prompts/pass_rate_p10", "prompts/pass_rate_p50", "prompts/pass_rate_p90"} <= r.keys()
        for r in rows[1:]
    )
    assert rows[-1]["prompts/seen_frac"] == 12 / 64
    state = json.loads((tmp_path / "u" / "checkpoints" / "step-3" / "state.json").read_text())
    assert len(state["curriculum"]["rates"]) == 12


def test_difficulty_run_turns_to_intermediate_prompts(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With prompts always right, always wrong and in between (`prompt_class_reward`), the difficulty
    scheduler's late steps draw intermediate prompts, and the filter logs what it skips."""
    produced = _recorded_run(
        tmp_path,
        micro_model_dir,
        monkeypatch,
        "d",
        **{
            "run.steps": 10,
            "data.train_size": 24,
            "reward.fn": "tests.rewards_for_tests:prompt_class_reward",
            "data.scheduler": "difficulty",
            "data.difficulty_filter.cooldown_steps": 3,
        },
    )
    late = [i for ids in produced[6:] for i in ids]
    assert sum(kind(i) == 2 for i in late) / len(late) >= 0.75
    rows = [json.loads(x) for x in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["prompts/skipped_frac"] for r in rows[1:]) > 0


def test_difficulty_run_killed_and_resumed_equals_an_unbroken_one(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    assert_same_weights(
        *killed_and_resumed(
            tmp_path,
            micro_model_dir,
            **{
                "data.scheduler": "difficulty",
                "data.difficulty_filter.hi": 0.9,
                "data.difficulty_filter.cooldown_steps": 2,
            },
        )
    )


def test_async_difficulty_run_sees_results_late_but_still_turns_to_intermediate_prompts(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With η = 2 a step is drawn before the two steps ahead of it are observed: the curriculum reacts
    later, and still ends on the intermediate prompts."""
    produced = _recorded_run(
        tmp_path,
        micro_model_dir,
        monkeypatch,
        "a",
        **{
            "run.steps": 12,
            "data.train_size": 24,
            "reward.fn": "tests.rewards_for_tests:prompt_class_reward",
            "data.scheduler": "difficulty",
            "cluster.mode": "async",
            "cluster.max_staleness": 2,
        },
    )
    assert len(produced) == 12  # one producer: the steps in order
    late = [i for ids in produced[8:] for i in ids]
    assert sum(kind(i) == 2 for i in late) / len(late) >= 0.75

"""DAPO's dynamic sampling (refill to `data.prompts_per_step` groups with differing rewards) and overlong
filtering (`algorithm.mask_truncated`): unit behaviour on fixed rollouts, then whole runs (sync, async,
killed and resumed)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hone.config import AlgorithmConfig, ConfigError, ReplayConfig, TrainerConfig, load_config
from hone.rewards import RewardScorer
from hone.rl.components import ProducerParts
from hone.rl.learner import Learner
from hone.rl.loop import learn_step, train
from hone.rl.placement.weights import LocalWeightChannel
from hone.rl.producer import Producer, ProducerSettings
from hone.rl.replay import ReplayBuffer, is_replayed
from hone.rollout.base import GenerationRequest
from hone.training.advantages import truncation_mask
from hone.training.collate import collate
from hone.training.policy import Policy
from hone.training.trainer import RLTrainer
from hone.types import Rollout, Sample, SamplingParams, TrainBatch
from tests.helpers import (
    FixedSampler,
    PlainTokenizer,
    RecordingTrainer,
    assert_same_weights,
    killed_and_resumed,
    sync_source,
    tiny_overrides,
    train_batch,
)

N = 2  # rollouts per prompt in the unit tests


def _fake_sampler(truncated: set[str] = frozenset()) -> FixedSampler:  # type: ignore[assignment]
    """A stand-in for sampling: prompt `s` gets N one-token responses [0] and [1] (group = its index);
    the responses of prompts in `truncated` end on the length limit."""

    def respond(request: GenerationRequest, params: SamplingParams) -> list[Rollout]:
        end = "length" if request.sample_id in truncated else "stop"
        return [
            Rollout(request.sample_id, request.group_id, [1, 2, k], 2, [1], [-0.5], finish_reason=end)
            for k in range(N)
        ]

    return FixedSampler(respond)


def _reward(rollout: Rollout, sample: Sample) -> float:
    """Prompts named u* are uniform (every response 1); the others reward response [1] over [0]."""
    return 1.0 if sample.id.startswith("u") else float(rollout.response_ids[0])


def _step(
    monkeypatch: pytest.MonkeyPatch,
    step_ids: list[str],
    pool_ids: list[str],
    overrides: list[str],
    truncated: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[dict[str, float], RecordingTrainer]:
    """One `learn_step` through the loop's producer and learner on fixed rollouts: the step's prompts are
    `step_ids`, the training set (what a refill draws from) `pool_ids`."""
    pool = {i: Sample(id=i, prompt=i) for i in pool_ids}
    sampler = _fake_sampler(truncated)
    parts = ProducerParts(
        sampler=sampler,  # type: ignore[arg-type]
        tokenizer=PlainTokenizer(),  # type: ignore[arg-type]
        processor=None,
        reward=RewardScorer(_reward),
        train_samples=list(pool.values()),
    )
    weights = LocalWeightChannel(dict, sampler, timeout_s=60)  # type: ignore[arg-type]
    cfg = load_config(None, ["algorithm.kl.coef=0", *overrides])
    trainer = RecordingTrainer()
    rollouts = sync_source(
        Producer(parts, ProducerSettings.of(cfg)),
        weights,
        3,
        [Sample(id=i, prompt=i) for i in step_ids],
    )
    learner = Learner(
        policy=SimpleNamespace(device=torch.device("cpu")),  # type: ignore[arg-type]
        ref_policy=None,
        trainer=trainer,  # type: ignore[arg-type]
        algorithm=cfg.algorithm,
        trainer_cfg=cfg.trainer,
        temperature=cfg.rollout.temperature,
        pad_id=0,
        publish=rollouts.publish,
    )
    return learn_step(3, rollouts, learner)[1], trainer


POOL = [f"u{i}" for i in range(6)] + [f"v{i}" for i in range(6)]
REFILL = ["algorithm.dynamic_sampling.enabled=true"]


def _groups(batch: TrainBatch) -> list[list[int]]:
    """Each row's group id and its response token, for comparing batches."""
    return [[int(g), int(row[2])] for g, row in zip(batch.group_ids, batch.input_ids, strict=True)]


def test_refill_samples_more_prompts_until_every_group_has_a_gradient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics, trainer = _step(monkeypatch, ["u0", "u1", "v0", "u2"], POOL, REFILL)
    (batch,) = trainer.batches
    assert batch.group_ids.tolist() == [g for g in range(4) for _ in range(N)]  # 4 groups, numbered 0..3
    # every group trained has one response of each reward: GRPO advantages ±1/√2, none 0
    assert batch.advantages is not None and bool((batch.advantages[:, 1].abs() > 0.5).all())
    assert metrics["groups/attempts"] >= 2 and metrics["groups/resampled"] >= 3
    assert metrics["groups/short"] == 0
    # the same step again samples the same refill prompts: they are a function of (seed, step, round)
    again, trainer2 = _step(monkeypatch, ["u0", "u1", "v0", "u2"], POOL, REFILL)
    assert again["groups/resampled"] == metrics["groups/resampled"]
    assert _groups(trainer2.batches[0]) == _groups(batch)


def test_refill_stops_after_max_rounds_and_trains_on_what_it_has(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    uniform = [f"u{i}" for i in range(8)]  # the training set: nothing a refill draws has a gradient
    with caplog.at_level("WARNING"):
        metrics, trainer = _step(
            monkeypatch,
            ["u0", "v0", "u1", "u2"],
            uniform,
            [*REFILL, "algorithm.dynamic_sampling.max_rounds=2"],
        )
    assert metrics["groups/attempts"] == 3 and metrics["groups/short"] == 3
    # the first round keeps 1 group of 4 sampled: to find 3 more at that rate it draws a whole step (4),
    # and so does the second, which starts from the same rate
    assert metrics["groups/resampled"] == 8
    (batch,) = trainer.batches
    assert batch.group_ids.tolist() == [0] * N and batch.input_ids.shape[0] == N  # v0's group alone
    assert any("after 2 extra sampling rounds" in r.getMessage() for r in caplog.records)


def test_a_step_that_needs_no_refill_samples_once(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics, trainer = _step(monkeypatch, ["v0", "v1", "v2", "v3"], POOL, REFILL)
    assert metrics["groups/attempts"] == 1 and metrics["groups/resampled"] == 0
    assert trainer.batches[0].group_ids.tolist() == [g for g in range(4) for _ in range(N)]


def test_without_refill_uniform_groups_are_dropped_or_kept_as_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dropped, trainer = _step(
        monkeypatch, ["u0", "v0", "u1", "v1"], POOL, ["algorithm.skip_zero_variance_groups=true"]
    )
    assert trainer.batches[0].group_ids.tolist() == [1, 1, 3, 3]  # drop without refill, as before
    assert dropped["groups/skipped_frac"] == 0.5 and "groups/attempts" not in dropped
    kept, trainer = _step(
        monkeypatch, ["u0", "v0", "u1", "v1"], POOL, ["algorithm.skip_zero_variance_groups=false"]
    )
    assert trainer.batches[0].group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert "groups/skipped_frac" not in kept


def test_mask_truncated_takes_truncated_responses_out_of_the_loss_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The truncated group's rows get response mask 0; every advantage (theirs included: they still count
    in their group's baseline) and every other row's mask is as without the option."""
    step = ["v0", "v1", "v2"]
    plain, plain_trainer = _step(monkeypatch, step, POOL, [], truncated={"v1"})
    masked, masked_trainer = _step(
        monkeypatch, step, POOL, ["algorithm.mask_truncated=true"], truncated={"v1"}
    )
    a, b = plain_trainer.batches[0], masked_trainer.batches[0]
    assert torch.equal(a.advantages, b.advantages)  # type: ignore[arg-type]
    rows = b.group_ids == 1
    assert b.loss_mask[rows].sum() == 0 and a.loss_mask[rows].sum() == N
    assert torch.equal(a.loss_mask[~rows], b.loss_mask[~rows])
    assert masked["loss/truncated_masked_frac"] == pytest.approx(1 / 3)
    assert masked["response_length/clip_frac"] == plain["response_length/clip_frac"] == pytest.approx(1 / 3)


def _update(model_dir: Path, truncated_advantage: float, mask: bool) -> dict[str, torch.Tensor]:
    """Weights after one SGD step on four rollouts, of which row 1 is truncated with the given advantage."""
    torch.manual_seed(0)
    policy = Policy.from_pretrained(model_dir)
    trainer = RLTrainer(
        policy, AlgorithmConfig(), TrainerConfig(lr=1e-2), total_rl_steps=1, temperature=1.0, norm_len=8
    )
    trainer.optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
    g = torch.Generator().manual_seed(0)
    rollouts = [
        Rollout("s", i // 2, [5, 6, *torch.randint(2, 60, (4,), generator=g).tolist()], 2, [1] * 4, [0.0] * 4)
        for i in range(4)
    ]
    rollouts[1].finish_reason = "length"
    seqs = collate(rollouts, pad_id=0)
    with torch.no_grad():
        old_logp, _ = policy.token_log_probs(seqs.input_ids, seqs.attention_mask)
    advantages = torch.tensor([[1.0], [truncated_advantage], [-1.0], [0.5]]) * seqs.response_mask
    loss_mask = truncation_mask(rollouts, seqs.response_mask)[0] if mask else seqs.response_mask
    trainer.update(train_batch(seqs, old_logp=old_logp, advantages=advantages, loss_mask=loss_mask), 0)
    return {k: v.clone() for k, v in policy.model.state_dict().items()}


def test_a_masked_truncated_response_contributes_no_gradient(micro_model_dir: Path) -> None:
    masked = _update(micro_model_dir, 1.0, mask=True)
    other = _update(micro_model_dir, -3.0, mask=True)  # whatever its advantage, the update is the same
    assert all(torch.equal(masked[k], other[k]) for k in masked)
    unmasked = _update(micro_model_dir, 1.0, mask=False)
    assert any(not torch.equal(masked[k], unmasked[k]) for k in masked)  # the row did count without it


REFILL_RUN = {
    "reward.fn": "tests.rewards_for_tests:half_uniform_reward",
    "algorithm.dynamic_sampling.enabled": "true",
    "run.save_every": 3,
    "run.eval_every": 0,
    "run.steps": 3,
}


def _rows(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1:]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_with_refill_logs_its_rounds_and_async_equals_sync(
    tmp_path: Path, micro_model_dir: Path, mode: str
) -> None:
    """In async mode the producer thread filters and refills before a step reaches the buffer: with η = 0
    the run trains exactly as the synchronous one."""
    sync = tmp_path / "sync"
    train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "sync", **REFILL_RUN)))
    rows = _rows(sync)
    assert all(r["groups/short"] == 0 and r["groups/attempts"] >= 1 for r in rows)
    assert sum(r["groups/resampled"] for r in rows) > 0  # some step did refill
    if mode == "async":
        extra = {"cluster.mode": "async", "cluster.max_staleness": 0}
        train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "async", **REFILL_RUN, **extra)))
        assert [r["groups/resampled"] for r in _rows(tmp_path / "async")] == [
            r["groups/resampled"] for r in rows
        ]
        assert_same_weights(
            sync / "checkpoints" / "step-3" / "model", tmp_path / "async" / "checkpoints" / "step-3" / "model"
        )


def test_async_refill_with_staleness_fills_every_step(tmp_path: Path, micro_model_dir: Path) -> None:
    extra = {"cluster.mode": "async", "cluster.max_staleness": 1, "run.steps": 4, "run.save_every": 4}
    train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "ahead", **(REFILL_RUN | extra))))
    rows = _rows(tmp_path / "ahead")
    assert len(rows) == 4 and all(r["groups/short"] == 0 for r in rows)
    assert sum(r["groups/resampled"] for r in rows) > 0


def test_resume_with_refill_is_exact(tmp_path: Path, micro_model_dir: Path) -> None:
    """A run killed between checkpoints and resumed refills its steps again with the same prompts and
    seeds: it ends on the same weights as one never stopped."""
    straight, killed = killed_and_resumed(
        tmp_path,
        micro_model_dir,
        **{
            "reward.fn": "tests.rewards_for_tests:half_uniform_reward",
            "algorithm.dynamic_sampling.enabled": "true",
            "algorithm.mask_truncated": "true",
        },
    )
    assert_same_weights(straight, killed)
    resampled = [r["groups/resampled"] for r in _rows(tmp_path / "killed")]
    assert resampled == [r["groups/resampled"] for r in _rows(tmp_path / "straight")] and sum(resampled) > 0


def _group(sample_id: str, group: int, rewards: list[float], version: int = 0) -> list[Rollout]:
    return [
        Rollout(sample_id, group, [1, 2, k], 2, [1], [-0.1 * (version + 1)], reward=r, policy_version=version)
        for k, r in enumerate(rewards)
    ]


def test_replay_puts_a_past_success_into_a_later_group_of_a_prompt_still_unsolved() -> None:
    buffer = ReplayBuffer(ReplayConfig(enabled=True, min_reward=1.0, max_pass_rate=0.5))
    buffer.begin(0)
    first = _group("hard", 0, [0, 1, 0, 0], version=0) + _group("easy", 1, [1, 1, 0, 0], version=0)
    buffer.mix(first)
    assert not any(map(is_replayed, first))  # nothing stored before: the fresh samples stand
    buffer.begin(1)
    later = _group("easy", 0, [0, 0, 0, 0], version=3) + _group("hard", 1, [0, 0, 0, 0], version=3)
    buffer.mix(later)
    replayed = [r for r in later if is_replayed(r)]
    # hard (1 of 4 < 0.5) was stored and comes back as the last of its group; easy (2 of 4) was not
    assert [(r.sample_id, r.group_id, r.reward) for r in replayed] == [("hard", 1, 1.0)]
    assert later[-1] is replayed[0] and len(later) == 8
    assert replayed[0].sampler_logprobs == [-0.1] and replayed[0].policy_version == 0  # its behaviour policy
    buffer.begin(2)
    solved = _group("hard", 0, [1, 1, 1, 0], version=5)
    buffer.mix(solved)  # solved enough now: no replay, and the entry goes
    buffer.begin(3)
    again = _group("hard", 0, [0, 0, 0, 0], version=6)
    buffer.mix(again)
    assert not any(map(is_replayed, solved + again))


def test_replay_state_is_the_buffer_before_the_step_and_a_retried_step_starts_from_it() -> None:
    buffer = ReplayBuffer(ReplayConfig(enabled=True))
    buffer.begin(0)
    buffer.mix(_group("hard", 0, [0, 1, 0, 0]))
    buffer.begin(1)  # the producer runs ahead (async): step 1 stores another prompt
    buffer.mix(_group("other", 0, [1, 0, 0, 0]))
    saved = buffer.state_dict(1)  # the checkpoint after step 1 trained... is the state before step 1
    assert [r["sample_id"] for r in saved] == ["hard"]
    buffer.begin(1)  # a retry of step 1 restarts from the same state
    retried = _group("other", 0, [0, 0, 0, 0])
    buffer.mix(retried)
    assert not any(map(is_replayed, retried))
    restored = ReplayBuffer(ReplayConfig(enabled=True))
    restored.load_state_dict(json.loads(json.dumps(saved)))
    restored.begin(1)
    group = _group("hard", 0, [0, 0, 0, 0])
    restored.mix(group)
    assert is_replayed(group[-1]) and group[-1].reward == 1.0


REPLAY_RUN = {
    "reward.fn": "tests.rewards_for_tests:token_id_reward",  # 0..6: a success (>= 5) is rare
    "algorithm.replay.min_reward": 5,
    "run.steps": 4,
    "run.save_every": 4,
    "run.eval_every": 0,
    "data.train_size": 8,  # prompts come back every other step
}


def test_replay_off_and_replay_that_never_stores_train_alike(tmp_path: Path, micro_model_dir: Path) -> None:
    train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "replay-off", **REPLAY_RUN)))
    never = {"algorithm.replay.enabled": "true", "algorithm.replay.min_reward": 1e9}
    train(
        load_config(None, tiny_overrides(tmp_path, micro_model_dir, "replay-never", **(REPLAY_RUN | never)))
    )
    assert_same_weights(
        *(tmp_path / r / "checkpoints" / "step-4" / "model" for r in ("replay-off", "replay-never"))
    )
    assert all(r["replay/frac"] == 0 for r in _rows(tmp_path / "replay-never"))
    assert all("replay/frac" not in r for r in _rows(tmp_path / "replay-off"))


def test_resume_with_replay_is_exact(tmp_path: Path, micro_model_dir: Path) -> None:
    """The buffer is checkpointed as it was before the next step: a killed and resumed run replays the
    same successes and ends on the same weights. (Async mode with η > 0 is not bit-exact on resume
    anyway: which version samples a step depends on timing; the state's ahead-of-the-learner case is
    the unit test above.)"""
    straight, killed = killed_and_resumed(
        tmp_path,
        micro_model_dir,
        **{
            "reward.fn": "tests.rewards_for_tests:token_id_reward",
            "algorithm.replay.enabled": "true",
            "algorithm.replay.min_reward": 5,
            "data.train_size": 8,
        },
    )
    assert_same_weights(straight, killed)
    frac = [r["replay/frac"] for r in _rows(tmp_path / "killed")]
    assert frac == [r["replay/frac"] for r in _rows(tmp_path / "straight")] and sum(frac[4:]) > 0


def test_async_replay_mixes_successes_and_staleness_counts_only_sampled_rollouts(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    extra = {"algorithm.replay.enabled": "true", "cluster.mode": "async", "cluster.max_staleness": 1}
    train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "ahead", **(REPLAY_RUN | extra))))
    rows = _rows(tmp_path / "ahead")
    assert sum(r["replay/frac"] for r in rows) > 0 and all(r["staleness/max"] <= 1 for r in rows)


@pytest.mark.parametrize("setting", ["cluster.producers=2", "cluster.backend=ray"])
def test_replay_is_refused_where_more_than_one_producer_would_hold_the_buffer(setting: str) -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.replay needs one local producer"):
        load_config(None, ["algorithm.replay.enabled=true", "cluster.mode=async", setting])

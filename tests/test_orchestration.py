"""The synchronous loop: collate alignment, prompt order, end-to-end run, bad input, resume after SIGKILL."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from hone.config import AlgorithmConfig, ConfigError, TrainerConfig, load_config
from hone.data.schedulers import PromptStream
from hone.rewards import RewardScorer
from hone.rewards.outage import RewardOutageError
from hone.rewards.resolve import load_reward
from hone.rl import evaluate as evaluate_module
from hone.rl import start as rl_start
from hone.rl.components import ProducerParts
from hone.rl.learner import Learner
from hone.rl.loop import SetupError, learn_step, train
from hone.rl.placement.weights import LocalWeightChannel
from hone.rl.producer import Producer, ProducerSettings, drop_zero_variance_groups
from hone.rollout.base import GenerationRequest
from hone.rollout.multiturn import EpisodeLimits, Episodes
from hone.training.collate import collate
from hone.training.distributed import ONE_RANK
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


def rollout(prompt: list[int], response: list[int], group: int = 0, reward: float = 0.0) -> Rollout:
    return Rollout(
        sample_id="s",
        group_id=group,
        token_ids=prompt + response,
        prompt_len=len(prompt),
        loss_mask=[1] * len(response),
        sampler_logprobs=[-0.5 - i for i in range(len(response))],
        reward=reward,
    )


def test_collate_aligns_response_columns_with_next_token_targets() -> None:
    batch = collate([rollout([5, 6, 7], [8, 9]), rollout([5], [8, 9, 10, 11])], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 8, 9, 10, 11]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    # column t scores token t+1: response tokens of row 0 sit at indices 3, 4 → columns 2, 3
    assert batch.response_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert batch.sampler_log_probs[0].tolist() == [0, 0, -0.5, -1.5]
    short = collate([rollout([5, 6], [8]), rollout([5], [8, 9, 10])], pad_id=0)
    assert short.input_ids[0].tolist() == [5, 6, 8, 0] and short.attention_mask[0].tolist() == [1, 1, 1, 0]
    assert short.response_mask[0].tolist() == [0, 1, 0]


def test_collate_rejects_inconsistent_rollouts() -> None:
    bad = rollout([5], [8, 9])
    bad.loss_mask = [1]
    with pytest.raises(ValueError, match="loss_mask"):
        collate([bad], pad_id=0)


def test_prompt_stream_is_a_pure_function_of_seed_and_step() -> None:
    samples = [Sample(id=str(i), prompt=str(i)) for i in range(10)]
    a, b = PromptStream(samples, 4, seed=3), PromptStream(samples, 4, seed=3)
    order = [s.id for step in range(5) for s in a.batch(step)]
    assert [s.id for s in b.batch(4)] == order[16:20]  # random access equals sequential
    assert sorted(order[:10]) == sorted(s.id for s in samples)  # first epoch is a permutation
    assert (
        order[:10] != [s.id for step in range(3) for s in PromptStream(samples, 4, seed=4).batch(step)][:10]
    )


def test_zero_variance_groups_are_dropped() -> None:
    rs = [rollout([1], [2], group=g, reward=r) for g, r in [(0, 1), (0, 1), (1, 0), (1, 1)]]
    kept, frac = drop_zero_variance_groups(rs)
    assert [r.group_id for r in kept] == [1, 1] and frac == 0.5


REQUIRED_KEYS = {
    "step",
    "reward/mean",
    "loss/policy",
    "entropy",
    "clip_frac",
    "response_length/mean",
    "time/step_s",
    "throughput/tokens_per_s",
    "kl",
    "mismatch/logprob_abs",
    "answers/top_share",
    "time/reward_s",
    "reward/excluded_frac",
}


def test_end_to_end_run_writes_metrics_checkpoints_and_changes_weights(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    cfg = load_config(
        None,
        tiny_overrides(
            tmp_path,
            micro_model_dir,
            "e2e",
            **{
                "run.steps": 3,
                "run.save_every": 2,
                "run.eval_every": 0,
                "algorithm.kl.coef": 0.01,
                "algorithm.old_log_probs": "recompute",
                "trainer.mini_batches": 2,
                "trainer.micro_batch_size": 3,
                # a reward that always varies within a group, so every step has a gradient
                "reward.fn": "tests.rewards_for_tests:token_id_reward",
                "logging.plot": "[reward/mean, eval/accuracy]",
            },
        ),
    )
    result = train(cfg)
    run = tmp_path / "e2e"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[-1]
    for row in rows[1:]:
        assert row.keys() >= REQUIRED_KEYS, REQUIRED_KEYS - row.keys()
        assert row["mismatch/logprob_abs"] < 1e-4  # sampler and trainer score tokens alike
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-3"]
    assert load_config(run / "config.yaml") == cfg
    start = load_file(str(micro_model_dir / "model.safetensors"))
    end = load_file(str(run / "checkpoints" / "step-3" / "model" / "model.safetensors"))
    assert any(not torch.equal(start[k], end[k]) for k in start)
    assert result.steps == 3
    assert set(result.final_eval) >= {"eval/accuracy", "eval/pass@1", "eval/top_answer_share"}
    assert (run / "curves.png").read_bytes().startswith(b"\x89PNG")  # logging.plot (matplotlib: dev extra)


def test_bad_input_fails_before_training(tmp_path: Path, micro_model_dir: Path) -> None:
    missing = tiny_overrides(
        tmp_path,
        micro_model_dir,
        "bad1",
        **{"data.task": "null", "data.source": "nope.jsonl", "data.eval_source": "nope.jsonl"},
    )
    with pytest.raises(SetupError, match=r"nope\.jsonl"):
        train(load_config(None, missing))
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    no_answer = tiny_overrides(
        tmp_path,
        micro_model_dir,
        "bad2",
        **{"data.task": "null", "data.source": str(rows), "data.eval_source": str(rows), "reward.fn": "math"},
    )  # math grades against the row's answer: a row without one is refused (TRL's prompt-only rows are not)
    with pytest.raises(SetupError, match=r"rows\.jsonl.*2.*answer.*reward\.fn math"):
        train(load_config(None, no_answer))
    no_model = tiny_overrides(tmp_path, tmp_path / "no-such-model", "bad3")
    with pytest.raises(SetupError, match="no-such-model"):
        train(load_config(None, no_model))
    for name in ("bad1", "bad2", "bad3"):
        assert not (tmp_path / name / "checkpoints").exists()


def test_a_failing_reward_scores_zero_and_is_counted(tmp_path: Path, micro_model_dir: Path) -> None:
    cfg = load_config(
        None,
        tiny_overrides(
            tmp_path,
            micro_model_dir,
            "flaky",
            **{
                "run.steps": 1,
                "run.eval_every": 0,
                "reward.fn": "tests.rewards_for_tests:fails_on_half_the_prompts",
            },
        ),
    )
    train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "flaky" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["reward/errors"] > 0
    # The eval grades only what was scored: the failed responses are counted, not graded as wrong.
    assert rows[0]["eval/errors"] > 0 and rows[0]["eval/errors"] + rows[0]["eval/scored"] == 16


def test_sigkill_between_checkpoints_then_resume_gives_identical_weights(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    assert_same_weights(*killed_and_resumed(tmp_path, micro_model_dir))


def test_resume_is_exact_with_lr_warmup_and_decay_kl_and_a_lora_warm_start(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """No time limit, so the LR is a function of the RL step: the resumed run must retrace the warm-up
    and cosine decay, keep the SFT adapter as its KL reference, and end on the same weights."""
    straight, killed = killed_and_resumed(
        tmp_path,
        micro_model_dir,
        **{
            "trainer.schedule": "cosine",
            "trainer.warmup_steps": 2,
            "trainer.lr": 1e-2,
            "algorithm.kl.coef": 0.1,
            "model.lora.r": 4,
            "model.lora.alpha": 8,
            "sft.enabled": "true",
            "sft.max_steps": 2,
            "sft.examples": 16,
            "sft.batch_size": 8,
            "sft.val_size": 4,
        },
    )
    assert (straight / "adapter").is_dir() and (tmp_path / "killed" / "sft" / "adapter").is_dir()
    assert_same_weights(straight, killed)
    rows = [
        [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        for run in ("straight", "killed")
    ]
    lrs = [[row.get("lr") for row in run] for run in rows]
    assert lrs[0] == lrs[1] and lrs[0][1:3] == [5e-3, 1e-2]  # warm-up over 2 RL steps, then cosine
    assert rows[1][1]["kl"] == 0 < min(row["kl"] for row in rows[1][2:])  # starts at its SFT reference


def test_lora_run_trains_adapter_and_saves_merged_weights(tmp_path: Path, micro_model_dir: Path) -> None:
    cfg = load_config(
        None,
        tiny_overrides(
            tmp_path,
            micro_model_dir,
            "lora",
            **{
                "run.steps": 2,
                "run.eval_every": 0,
                "model.lora.r": 4,
                "model.lora.alpha": 8,
                "trainer.lr": 1e-2,
                "reward.fn": "tests.rewards_for_tests:token_id_reward",
            },
        ),
    )
    train(cfg)
    ckpt = tmp_path / "lora" / "checkpoints" / "step-2" / "model"
    start = load_file(str(micro_model_dir / "model.safetensors"))
    merged = load_file(str(ckpt / "model.safetensors"))
    assert start.keys() == merged.keys()  # plain HF names: loadable without peft
    changed = [k for k in start if not torch.equal(start[k], merged[k])]
    assert changed and all("proj" in k for k in changed)  # only LoRA-wrapped linears moved


def test_the_run_trainer_normalises_dr_grpo_by_the_episode_budget(micro_model_dir: Path) -> None:
    cfg = load_config(None, ["rollout.max_new_tokens=48", "algorithm.kl.coef=0"])
    limits = EpisodeLimits(max_turns=3, max_tokens_per_turn=20, max_total_tokens=1000)
    parts = SimpleNamespace(
        model_path=str(micro_model_dir),
        pad_id=0,
        episodes=Episodes(lambda: None, limits),  # type: ignore[arg-type]
    )
    start = rl_start.learner_start(cfg, parts, micro_model_dir, None)  # type: ignore[arg-type]
    assert start.norm_len == 60  # 3 turns x 20, not 48
    models = rl_start.learner_models(cfg, Policy.from_pretrained(micro_model_dir), start, ONE_RANK)
    assert models.trainer.norm_len == 60
    parts.episodes = None
    assert rl_start.learner_start(cfg, parts, micro_model_dir, None).norm_len == 48  # type: ignore[arg-type]


def test_a_run_directory_is_never_overwritten(tmp_path: Path, micro_model_dir: Path) -> None:
    overrides = tiny_overrides(tmp_path, micro_model_dir, "once", **{"run.steps": 0})
    train(load_config(None, overrides))
    before = (tmp_path / "once" / "metrics.jsonl").read_text()
    with pytest.raises(SetupError, match="already holds a run"):
        train(load_config(None, overrides))
    assert (tmp_path / "once" / "metrics.jsonl").read_text() == before


def one_step(
    monkeypatch: pytest.MonkeyPatch, responses: dict[str, list[list[int]]], reward: RewardScorer
) -> tuple[dict[str, float], RecordingTrainer]:
    """`learn_step` on fixed rollouts (`responses[sample_id]`: the token ids of each of its n responses),
    through the producer and learner the loop uses."""

    def respond(request: GenerationRequest, params: SamplingParams) -> list[Rollout]:
        return [
            Rollout(request.sample_id, request.group_id, [1, 2, *ids], 2, [1] * len(ids), [-0.5] * len(ids))
            for ids in responses[request.sample_id]
        ]

    samples = [Sample(id=sid, prompt="p") for sid in responses]
    sampler = FixedSampler(respond)
    parts = ProducerParts(
        sampler=sampler,  # type: ignore[arg-type]
        tokenizer=PlainTokenizer(),  # type: ignore[arg-type]
        processor=None,
        reward=reward,
        train_samples=samples,
    )
    weights = LocalWeightChannel(dict, sampler, timeout_s=60)  # type: ignore[arg-type]
    cfg = load_config(None, ["algorithm.skip_zero_variance_groups=false", "algorithm.kl.coef=0"])
    trainer = RecordingTrainer()
    # Retries as a run has them: an outage must stop the run, not be produced again.
    rollouts = sync_source(
        Producer(parts, ProducerSettings.of(cfg)),
        weights,
        0,
        samples,
        retries=cfg.cluster.producer_retries,
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
    metrics = learn_step(0, rollouts, learner)[1]
    return metrics, trainer


def by_response(table: dict[int, float | Callable[[], float]]) -> Callable[[Rollout, Sample], float]:
    """A reward looked up by a one-token response; a callable entry is called (to raise or to hang)."""

    def reward(rollout: Rollout, sample: Sample) -> float:
        entry = table[rollout.response_ids[0]]
        return entry() if callable(entry) else entry

    return reward


def test_rollouts_whose_reward_failed_are_left_out_of_the_loss_and_the_rest_are_trained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def crash() -> float:
        raise ConnectionError("judge returned HTTP 502")

    def hang() -> float:
        time.sleep(3)  # past the 0.5 s timeout: abandoned
        return 1.0

    reward = RewardScorer(
        by_response({10: 1.0, 11: crash, 12: 0.0, 20: 1.0, 21: 0.0, 22: hang}), timeout_s=0.5
    )
    metrics, trainer = one_step(monkeypatch, {"a": [[10], [11], [12]], "b": [[20], [21], [22]]}, reward)
    (batch,) = trainer.batches
    trained = {int(row[2]): float(adv[1]) for row, adv in zip(batch.input_ids, batch.advantages, strict=True)}
    # Each group keeps its two graded members, rewards 1 and 0: GRPO gives ±0.5 / std([1, 0]) = ±1/√2.
    # Had the failures been trained on as 0, group a would be [1, 0, 0]: advantages 1.155, -0.577, -0.577.
    assert trained == pytest.approx({10: 2**-0.5, 12: -(2**-0.5), 20: 2**-0.5, 21: -(2**-0.5)}, abs=1e-5)
    assert metrics["reward/errors"] == 1.0 and metrics["reward/timeouts"] == 1.0
    assert metrics["reward/excluded_frac"] == pytest.approx(2 / 6)


def test_steps_on_which_every_reward_failed_warn_once_then_stop_the_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A judge down fails every reward: such a step trains on nothing (failures are left out of the
    loss). The first is a warning; `reward.max_failed_steps` (5) of them in a row stop the run."""

    def crash() -> float:
        raise ConnectionError("judge returned HTTP 502")

    reward = RewardScorer(by_response({10: crash, 11: crash, 20: 1.0, 21: 0.0}))
    down, up = {"a": [[10], [11]]}, {"a": [[20], [21]]}
    with caplog.at_level("WARNING"):
        for responses in [down] * 4 + [up] + [down] * 4:  # a step that trains ends the streak
            metrics, trainer = one_step(monkeypatch, responses, reward)
            assert metrics["reward/excluded_frac"] == (0.0 if responses is up else 1.0)
            assert len(trainer.batches) == (responses is up)
    assert len([r for r in caplog.records if "the step trains on nothing" in r.getMessage()]) == 1
    with pytest.raises(RewardOutageError, match=r"on 5 steps in a row \(reward.max_failed_steps\)"):
        one_step(monkeypatch, down, reward)


def test_reward_scoring_is_timed_apart_from_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(rollout: Rollout, sample: Sample) -> float:
        time.sleep(0.2)
        return float(rollout.response_ids[0] % 2)

    metrics, trainer = one_step(monkeypatch, {"a": [[10], [11]], "b": [[20], [21]]}, RewardScorer(slow))
    assert metrics["time/reward_s"] >= 0.2
    # collate, advantages, an instant trainer: none of the reward's sleeps
    assert trainer.batches and metrics["time/train_s"] < metrics["time/reward_s"]
    parts = metrics["time/sample_s"] + metrics["time/reward_s"] + metrics["time/train_s"]
    # The step also draws its prompts and filters its rollouts, outside the three stages' clocks (a few ms;
    # the margin is for a loaded machine, far below another stage's time counted twice).
    assert parts <= metrics["time/step_s"] < parts + 0.15


def test_eval_accuracy_counts_the_correctness_component_not_the_shaped_total(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    overlong = "{fn: overlong, args: {max_len: 8, buffer: 4}}"
    cfg = load_config(
        None, ["reward.fn=null", f"reward.components={{correct: {{fn: math}}, overlong: {overlong}}}"]
    )
    responses = [("\\boxed{42}", 6), ("\\boxed{41}", 2), ("\\boxed{42}", 2)]  # right but long, wrong, right
    rollouts = [Rollout("s", 0, [0] * (2 + n), 2, [1] * n, [0.0] * n, text) for text, n in responses]
    sampler = FixedSampler(lambda request, params: rollouts)
    out = evaluate_module.evaluate(
        sampler,  # type: ignore[arg-type]
        PlainTokenizer(),  # type: ignore[arg-type]
        [Sample("s", prompt="What is 6*7?", answer="42")],
        load_reward(cfg.reward, None),
        SamplingParams(n=3, temperature=1.0),
        ks=[1],
    )
    assert [r.reward for r in rollouts] == pytest.approx([0.5, 0.0, 1.0])  # overlong: -0.5 two tokens in
    assert out["eval/accuracy"] == pytest.approx(2 / 3) and out["eval/pass@1"] == pytest.approx(2 / 3)


def test_a_pass_at_k_above_n_is_refused_alike_by_the_config_and_by_evaluate() -> None:
    """The config check comes before any model loads, the library guard before any sampling: one check."""
    with pytest.raises(ConfigError) as config_error:
        load_config(None, ["eval.n=2", "eval.k=[1,8]"])
    with pytest.raises(ValueError) as library_error:
        evaluate_module.evaluate(None, None, [], None, SamplingParams(n=2), ks=[1, 8])  # type: ignore[arg-type]
    assert str(library_error.value) in str(config_error.value)


def micro_batch(policy: Policy, offset: float) -> TrainBatch:
    """Six rollouts of uneven length whose `old_log_probs` are the policy's own plus `offset` per token."""
    g = torch.Generator().manual_seed(0)
    rollouts = []
    for i in range(6):
        prompt = torch.randint(2, 60, (3,), generator=g).tolist()
        response = torch.randint(2, 60, (2 + i,), generator=g).tolist()
        rollouts.append(
            Rollout("s", i // 3, prompt + response, 3, [1] * len(response), [0.0] * len(response))
        )
    seqs = collate(rollouts, pad_id=0)
    with torch.no_grad():
        policy.model.eval()
        log_probs, _ = policy.token_log_probs(seqs.input_ids, seqs.attention_mask)
    old_logp = torch.where(seqs.response_mask.bool(), log_probs + offset, 0.0)
    return train_batch(
        seqs, old_logp=old_logp, advantages=torch.linspace(-1, 1, 6).unsqueeze(-1) * seqs.response_mask
    )


@pytest.mark.parametrize("mode", ["sampler", "recompute"])
def test_sampler_mode_reports_the_mismatch_from_the_first_mini_batch_before_any_step(
    micro_model_dir: Path, mode: str
) -> None:
    policy = Policy.from_pretrained(micro_model_dir)
    trainer = RLTrainer(
        policy,
        AlgorithmConfig(old_log_probs=mode),  # type: ignore[arg-type]
        TrainerConfig(lr=5e-2, ppo_epochs=2, mini_batches=2, micro_batch_size=2),
        total_rl_steps=1,
        temperature=1.0,
        norm_len=8,
    )
    out = trainer.update(micro_batch(policy, offset=0.25), step=0)
    if mode == "recompute":  # measured between the batch's behaviour and old log-probs (here the same), not
        assert out["mismatch/logprob_abs"] == 0.0  # from the first mini-batch's forward (0.25 off)
        return
    # Later mini-batches see weights the optimizer moved: counting them would pull the mean off 0.25.
    # 1e-4: two fp32 forwards of the same weights (different micro-batch shapes) agree to ~1e-6 per token.
    assert out["mismatch/logprob_abs"] == pytest.approx(0.25, abs=1e-4)

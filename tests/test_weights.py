"""The sampler owns its weights: publishes through the weight channel, their versions, the prefix cache
they invalidate, their timeout; and a run with an owned copy trains exactly like one sharing the model."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from hone.config import load_config
from hone.rl.learner import Learner
from hone.rl.loop import train
from hone.rl.placement.weights import LocalWeightChannel, WeightPublishTimeout
from hone.rl.producer import ScoredGroups
from hone.rollout import HFSampler
from tests.conftest import char_tokenizer
from tests.helpers import (
    ATOL,
    CHARS,
    final_weights,
    full_forward_logprobs,
    greedy,
    make_model,
    next_turn,
    prefill_widths,
    recording_setup,
    requests,
    tiny_overrides,
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return char_tokenizer(CHARS, unk_token=None)


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


def test_a_publish_drops_the_prefix_cache_and_the_next_turn_uses_the_new_weights(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    learner_model = make_model(1)
    sampler = HFSampler(copy.deepcopy(learner_model), tokenizer)
    channel = LocalWeightChannel(lambda: _trainable(learner_model), sampler, timeout_s=60)
    widths = prefill_widths(sampler, monkeypatch)

    first = sampler.generate(requests(tokenizer), greedy(max_new_tokens=6))
    with torch.no_grad():
        next(learner_model.parameters()).mul_(1.5)  # an update the sampler is not told of: owned weights
    widths.clear()
    second = sampler.generate(next_turn(tokenizer, first, " ok "), greedy(max_new_tokens=8))
    assert max(widths) < min(len(r.token_ids) for r in first)  # same version: the cache is reused
    assert all(r.policy_version == 0 for r in second)

    channel.publish(1)
    assert channel.version == 1
    third_requests = next_turn(tokenizer, second, " ok ")
    widths.clear()
    third = sampler.generate(third_requests, greedy(max_new_tokens=8))
    assert widths == [max(len(r.prompt_ids) for r in third_requests)]  # everything prefilled again
    for rollout in third:
        assert rollout.policy_version == 1
        torch.testing.assert_close(  # float64 models: see ATOL
            torch.tensor(rollout.sampler_logprobs, dtype=torch.float64),
            full_forward_logprobs(learner_model, rollout, 0.0),
            atol=ATOL,
            rtol=0,
        )


def test_a_publish_made_while_the_sampler_holds_lands_at_its_next_hold_and_times_out_in_one_line(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """A publish does not wait for a sampler inside its generation: it snapshots the weights (an update
    made after the publish does not leak in) and the sampler's next outermost hold installs the newest
    snapshot. A snapshot that waits past the timeout fails `raise_if_overdue` in one line."""
    learner_model = make_model(2)
    sampler = HFSampler(copy.deepcopy(learner_model), tokenizer)
    channel = LocalWeightChannel(lambda: _trainable(learner_model), sampler, timeout_s=0.2)
    holding, release = threading.Event(), threading.Event()

    def generating() -> None:  # a sampler stuck inside its generation
        with channel.hold():
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=generating)
    thread.start()
    holding.wait(10)
    try:
        channel.publish(2)  # returns at once, though the sampler holds
        with torch.no_grad():
            next(learner_model.parameters()).add_(1.0)
        published_3 = {k: v.clone() for k, v in _trainable(learner_model).items()}
        channel.publish(3)  # supersedes 2
        with torch.no_grad():
            next(learner_model.parameters()).add_(1.0)  # after the publish: must not reach the sampler
        assert (sampler.policy_version, channel.published) == (0, 3)
        channel.raise_if_overdue()  # not yet overdue
        time.sleep(0.3)
        with pytest.raises(WeightPublishTimeout) as failed:
            channel.raise_if_overdue()
    finally:
        release.set()
        thread.join()
    assert str(failed.value) == (
        "weight publish of version 3 did not complete within 0.2 s: the sampler (at version 0) never "
        "left its generation to take it (cluster.publish_timeout_s)"
    )
    assert sampler.policy_version == 0  # leaving a hold installs nothing: the next one does
    with channel.hold() as version, channel.hold() as inner:
        assert version == inner == 3
    for name, tensor in sampler.model.named_parameters():
        torch.testing.assert_close(tensor.detach(), published_3[name], atol=0, rtol=0)
    channel.raise_if_overdue()  # installed: nothing pending


def test_a_publish_inside_the_publishers_own_hold_waits_for_the_outermost_entry(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    learner_model = make_model(3)
    sampler = HFSampler(copy.deepcopy(learner_model), tokenizer)
    channel = LocalWeightChannel(lambda: _trainable(learner_model), sampler, timeout_s=60)
    with channel.hold():
        channel.publish(1)
        with channel.hold() as inner:
            assert inner == 0  # an inner hold never changes the weights under the outer one
    channel.publish(2)  # between holds: installed at once
    assert sampler.policy_version == 2


RUNS: dict[str, dict[str, object]] = {
    "single-turn, KL, two epochs on the sampler's log-probs": {
        "trainer.ppo_epochs": 2,
        "algorithm.kl.coef": 0.05,
        "reward.fn": "tests.rewards_for_tests:token_id_reward",
    },
    "LoRA after an SFT warm start": {
        "model.lora.r": 4,
        "model.lora.alpha": 8,
        "trainer.lr": 1e-2,
        "sft.enabled": "true",
        "sft.max_steps": 2,
        "sft.examples": 16,
        "sft.batch_size": 8,
        "sft.val_size": 4,
        "sft.eval_every": 1,
        "reward.fn": "tests.rewards_for_tests:token_id_reward",
    },
    "multi-turn, prefix cache": {
        "data.task": "null",
        "env.name": "guess_number",
        "env.args": "{high: 8}",
        "env.max_tokens_per_turn": 3,
        "reward.fn": "env",
        "algorithm.advantage": "turn_grpo",
    },
}


@pytest.mark.parametrize("name", list(RUNS))
def test_a_sampler_owning_its_weights_trains_exactly_like_one_sharing_the_model(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The run's sampler owns a copy of the policy model; sharing the model object itself (what the loop
    did before the weight channel) must end on the same weights, bit for bit. In the owned run, after
    every publish the sampler's tensors equal the policy's without sharing storage, and every rollout a
    step trains on was sampled by the version the step before published."""
    published: list[int] = []
    trained_versions: list[tuple[int, set[int]]] = []
    real_publish = LocalWeightChannel.publish
    real_learn = Learner.learn
    setups = {share: recording_setup(reuse_model=share) for share in (False, True)}

    def checked_publish(self: LocalWeightChannel, version: int) -> None:
        real_publish(self, version)
        parts = setups[bool(setups[True][1])][1][-1]  # the run going on: the shared one once it has begun
        sampler_model, policy_model = parts.sampler.model, parts.policy.model  # type: ignore[attr-defined]
        if sampler_model is not policy_model:
            published.append(version)
            own = dict(sampler_model.named_parameters())
            for key, value in policy_model.named_parameters():
                assert torch.equal(own[key], value) and own[key].data_ptr() != value.data_ptr(), key

    def recording_learn(self: Learner, groups: ScoredGroups, step: int) -> dict[str, Any]:
        trained_versions.append((step, {r.policy_version for r in groups.rollouts}))
        return real_learn(self, groups, step)

    monkeypatch.setattr(LocalWeightChannel, "publish", checked_publish)
    monkeypatch.setattr(Learner, "learn", recording_learn)
    finals = {}
    for share in (False, True):
        run = f"shared-{share}"  # shared: the sampler samples over the policy's own model (`reuse_model`)
        extra = {"run.steps": 3, "run.save_every": 3, "run.eval_every": 0, **RUNS[name]}
        recipe = "agent-guess" if "env.name" in extra else None
        train(
            load_config(recipe, tiny_overrides(tmp_path, micro_model_dir, run, **extra)),
            setup=setups[share][0],
        )
        finals[share] = final_weights(tmp_path / run)
        if not share:
            assert published[-3:] == [1, 2, 3]
            assert trained_versions == [(0, {0}), (1, {1}), (2, {2})]
    owned, shared = finals[False], finals[True]
    assert owned.keys() == shared.keys() and all(torch.equal(owned[k], shared[k]) for k in owned)


def test_a_bf16_sampler_copy_gets_each_publish_cast_and_trains(tmp_path: Path, micro_model_dir: Path) -> None:
    """`rollout.dtype: bfloat16`: the sampler's copy is bf16, a publish lands in it cast from the fp32
    policy, and a run trains with log-probs that differ from the fp32 trainer's by bf16 rounding only."""
    import json

    from hone.rl.components import build_components
    from tests.helpers import TOKEN_REWARD, train_tiny

    cfg = load_config(
        None, tiny_overrides(tmp_path, micro_model_dir, "parts", **{"rollout.dtype": "bfloat16"})
    )
    parts = build_components(cfg)
    sampler_params = dict(parts.sampler.model.named_parameters())  # type: ignore[attr-defined]
    assert {p.dtype for p in sampler_params.values()} == {torch.bfloat16}
    with torch.no_grad():
        for p in parts.policy.model.parameters():
            p.add_(0.01)
    parts.weights.publish(1)
    for name, p in parts.policy.model.named_parameters():
        assert torch.equal(sampler_params[name], p.detach().to(torch.bfloat16))
    run = train_tiny(tmp_path, micro_model_dir, "bf16", **{"rollout.dtype": "bfloat16", **TOKEN_REWARD})
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]
    assert len(rows) == 3 and all(0 < r["mismatch/logprob_abs"] < 0.05 for r in rows)

"""Trust the sampler: every weight load is verified by an exact fingerprint of what the engine holds, and a
log-probability canary compares what it computes with the learner; either kind of difference stops the
run in one line (verl #7495: two months against a vLLM that never received the adapter)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from hone.config import load_config
from hone.rl.canary import LogprobCanary
from hone.rl.loop import train
from hone.rl.placement.weights import LocalWeightChannel
from hone.rollout import HFSampler
from hone.rollout.base import GenerationRequest
from hone.rollout.engines import hf_engine
from hone.rollout.fingerprint import (
    WeightMismatchError,
    bit_sum,
    compare,
    expected_for,
    fingerprint,
    verify_load,
)
from hone.types import Rollout, SamplingParams
from tests.conftest import char_tokenizer
from tests.helpers import CHARS, TOKEN_REWARD, logged_steps, make_model, tiny_overrides


def _flip_bit(tensor: torch.Tensor, index: int, bit: int) -> None:
    """Flip one bit of one element in place (a transport that corrupted the tensor)."""
    ints = tensor.view(torch.int32 if tensor.element_size() == 4 else torch.int16).view(-1)
    ints[index] ^= 1 << bit


# --- the fingerprint -----------------------------------------------------------------------------------


def test_bit_sum_is_the_exact_sum_of_the_bit_patterns() -> None:
    values = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float32)
    # Hand value: IEEE-754 single bit patterns 0x3F800000, 0xC0000000 (as int32: -1073741824), 0x3F000000.
    assert bit_sum(values) == (0x3F800000 - 0x40000000 + 0x3F000000) & ((1 << 64) - 1)
    assert bit_sum(torch.zeros(7)) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bit", [0, 7, 15])
def test_any_single_flipped_bit_changes_the_fingerprint(dtype: torch.dtype, bit: int) -> None:
    weight = torch.randn(64, 33, generator=torch.Generator().manual_seed(0)).to(dtype)
    before = fingerprint({"w": weight})
    _flip_bit(weight, 1234, bit)
    assert compare(before, fingerprint({"w": weight})) is not None


def test_a_layer_fingerprint_does_not_depend_on_how_the_engine_packs_the_layer() -> None:
    """vLLM holds q/k/v as one `qkv_proj` and pads its vocabulary with zero rows: by_layer sums agree."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(8, 8, generator=gen) for _ in range(3))
    embed = torch.randn(10, 8, generator=gen)
    published = {
        "model.layers.0.self_attn.q_proj.weight": q,
        "model.layers.0.self_attn.k_proj.weight": k,
        "model.layers.0.self_attn.v_proj.weight": v,
        "model.embed_tokens.weight": embed,
        "lm_head.weight": embed,  # tied: published under two names, held once
    }
    held = fingerprint(
        {
            "model.layers.0.self_attn.qkv_proj.weight": torch.cat([q, k, v]),
            "model.embed_tokens.weight": torch.cat([embed, torch.zeros(6, 8)]),
        },
        by_layer=True,
    )
    assert compare(expected_for(published, held), held) is None
    stale = fingerprint(
        {
            "model.layers.0.self_attn.qkv_proj.weight": torch.cat([q, k, k]),
            **{"model.embed_tokens.weight": embed},
        },
        by_layer=True,
    )
    assert "model.layers.0" in str(compare(expected_for(published, held), stale))


def test_an_fp32_learner_and_a_bf16_engine_agree_exactly() -> None:
    """The expected side is cast as the engine casts (`copy_` into bf16 rounds as `.to` does)."""
    weight = torch.randn(300, 7, generator=torch.Generator().manual_seed(2))
    engine_copy = torch.empty(300, 7, dtype=torch.bfloat16)
    engine_copy.copy_(weight)
    held = fingerprint({"w": engine_copy})
    assert compare(expected_for({"w": weight}, held), held) is None
    assert compare(fingerprint({"w": weight}), held) is not None  # fp32 bits are not bf16 bits


# --- loads through the weight channel ------------------------------------------------------------------


class _IgnoresUpdates(HFSampler):
    """verl #7495's engine: takes the first weights, then says yes to every update and keeps them."""

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        if self.policy_version == 0 and version <= 1:
            super().load_weights(state_dict, version)
        self.policy_version = version


class _CorruptsLoads(HFSampler):
    """A transport that flips one bit of one published tensor on its way."""

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        super().load_weights(state_dict, version)
        with torch.no_grad():
            _flip_bit(next(self.model.parameters()).data, 5, 3)


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


def _update(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3)


@pytest.mark.parametrize("held_while_publishing", [False, True])
def test_a_sampler_that_ignores_updates_is_caught_at_the_first_one(held_while_publishing: bool) -> None:
    learner_model = make_model(1, torch.float32)
    sampler = _IgnoresUpdates(copy.deepcopy(learner_model), char_tokenizer(CHARS, unk_token=None))
    channel = LocalWeightChannel(lambda: _trainable(learner_model), sampler, timeout_s=60)
    channel.publish(1)  # the first load: taken
    _update(learner_model)
    if not held_while_publishing:  # a synchronous run: the load happens in the publish
        with pytest.raises(WeightMismatchError, match="version 2 on the _IgnoresUpdates sampler"):
            channel.publish(2)
        return
    with channel.hold():  # an asynchronous producer mid-share: the load happens as it starts the next
        channel.publish(2)
    with pytest.raises(WeightMismatchError, match=r"tensor\(s\) differ"), channel.hold():
        pass


def test_a_bit_flipped_on_the_way_is_caught_and_an_honest_bf16_engine_is_not_flagged() -> None:
    learner_model = make_model(1, torch.float32)
    tokenizer = char_tokenizer(CHARS, unk_token=None)
    corrupt = _CorruptsLoads(copy.deepcopy(learner_model), tokenizer)
    with pytest.raises(WeightMismatchError, match="not what the learner published"):
        LocalWeightChannel(lambda: _trainable(learner_model), corrupt, timeout_s=60).publish(1)
    bf16 = HFSampler(copy.deepcopy(learner_model).to(torch.bfloat16), tokenizer)
    channel = LocalWeightChannel(lambda: _trainable(learner_model), bf16, timeout_s=60)
    for version in (1, 2, 3):
        _update(learner_model)
        channel.publish(version)  # verified: no false alarm
    assert bf16.policy_version == 3 and channel.verify_s > 0


def test_a_sampler_reporting_another_version_is_caught() -> None:
    sampler = HFSampler(make_model(1, torch.float32), char_tokenizer(CHARS, unk_token=None))
    sampler.load_weights({}, 4)
    with pytest.raises(WeightMismatchError, match="reports weight version 4 after loading version 5"):
        verify_load(sampler, {}, 5)


# --- the log-prob canary --------------------------------------------------------------------------------


def test_the_canary_stops_after_patience_checks_in_a_row_and_forgives_one() -> None:
    canary = LogprobCanary(budget=1e-3, patience=3, engine="hf sampler")
    over = {"mismatch/canary_abs": 0.02, "mismatch/canary_max": 0.5, "mismatch/canary_tokens": 10.0}
    fine = over | {"mismatch/canary_abs": 1e-6}
    canary.check(dict(over), 0, 1)
    canary.check(dict(over), 1, 2)
    canary.check(dict(fine), 2, 3)  # one good check resets the count
    canary.check(dict(over), 3, 4)
    canary.check(dict(over | {"mismatch/canary_tokens": 0.0}), 4, 5)  # nothing fresh: not a check
    canary.check(dict(over), 5, 5)
    with pytest.raises(WeightMismatchError, match=r"step 7: the hf sampler.s log-probs .* 6 by 0\.02"):
        canary.check(dict(over), 6, 6)


# --- whole runs -----------------------------------------------------------------------------------------


def _overrides(tmp_path: Path, model_dir: Path, name: str, **extra: object) -> list[str]:
    settings = {"run.steps": 4, "run.save_every": 0, "run.eval_every": 0, **TOKEN_REWARD, **extra}
    return tiny_overrides(tmp_path, model_dir, name, **settings)


def _with_sampler(monkeypatch: pytest.MonkeyPatch, cls: type[HFSampler], shift: float = 0.0) -> None:
    """Runs build `cls` as their HF sampler; `shift` offsets every log-prob it reports."""
    real_build = hf_engine.HFEngine.build

    def build(self: hf_engine.HFEngine, *args: object, **kwargs: object) -> HFSampler:
        sampler = real_build(self, *args, **kwargs)  # type: ignore[arg-type]
        sampler.__class__ = cls
        if shift:
            generate = sampler.generate

            def shifted(requests: list, params: SamplingParams) -> list[Rollout]:  # type: ignore[type-arg]
                rollouts = generate(requests, params)
                for r in rollouts:
                    r.sampler_logprobs = [lp + shift for lp in r.sampler_logprobs]
                return rollouts

            sampler.generate = shifted  # type: ignore[method-assign]
        return sampler

    monkeypatch.setattr(hf_engine.HFEngine, "build", build)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_whose_sampler_ignores_updates_stops_within_3_steps(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    _with_sampler(monkeypatch, _IgnoresUpdates)
    cfg = load_config(None, _overrides(tmp_path, micro_model_dir, f"stale-{mode}", **{"cluster.mode": mode}))
    with pytest.raises(
        WeightMismatchError, match="_IgnoresUpdates sampler is not what the learner published"
    ):
        train(cfg)
    assert max(logged_steps(tmp_path / f"stale-{mode}" / "metrics.jsonl"), default=0) < 3


def test_a_run_with_a_bf16_sampler_and_an_fp32_learner_raises_no_false_alarm(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    cfg = load_config(None, _overrides(tmp_path, micro_model_dir, "bf16", **{"rollout.dtype": "bfloat16"}))
    result = train(cfg)
    assert result.steps == 4


@pytest.mark.parametrize("old_log_probs", ["sampler", "recompute"])
def test_the_canary_stops_a_run_whose_engine_computes_other_log_probs(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch, old_log_probs: str
) -> None:
    """The weights are right (the fingerprint passes) but the engine's numbers are not."""
    _with_sampler(monkeypatch, HFSampler, shift=0.01)
    name = f"canary-{old_log_probs}"
    overrides = _overrides(tmp_path, micro_model_dir, name, **{"algorithm.old_log_probs": old_log_probs})
    with pytest.raises(WeightMismatchError, match=r"step 3: the hf sampler's log-probs differ .* by 0\.01"):
        train(load_config(None, overrides))


# --- interruptible rollouts ----------------------------------------------------------------------------


def test_a_publish_lands_mid_generation_and_every_token_carries_its_version() -> None:
    """Greedy decoding: two tokens with version 0, then a publish between tokens; what follows is exactly
    what the new weights generate from the prompt and those two tokens (the live rows are re-prefilled)."""
    from tests.helpers import greedy, requests

    tokenizer = char_tokenizer(CHARS, unk_token=None)
    learner_model = make_model(3, torch.float32)
    sampler = HFSampler(copy.deepcopy(learner_model), tokenizer)
    channel = LocalWeightChannel(lambda: _trainable(learner_model), sampler, timeout_s=60, interruptible=True)
    install, calls = sampler.between_tokens, [0]
    assert install is not None

    def publish_before_the_third_token() -> bool:
        calls[0] += 1
        if calls[0] == 4:  # the call at the start of generate, then one before each token
            with torch.no_grad():
                for p in learner_model.parameters():
                    p.mul_(1.3)
            channel.publish(1)
        return install()

    sampler.between_tokens = publish_before_the_third_token
    with channel.hold():
        rollouts = sampler.generate(requests(tokenizer), greedy(max_new_tokens=8))
    fresh = HFSampler(copy.deepcopy(learner_model), tokenizer)
    switched = 0
    for r in rollouts:
        assert r.policy_version == 0
        if r.response_len <= 2:
            continue
        switched += 1
        assert r.token_versions == [0, 0] + [1] * (r.response_len - 2)
        (after,) = fresh.generate(
            [GenerationRequest("x", 0, r.token_ids[: r.prompt_len + 2], max_new_tokens=r.response_len - 2)],
            greedy(max_new_tokens=8),
        )
        assert after.response_ids == r.response_ids[2:]
        # A batch of re-prefilled rows against one fresh row: fp32 matmuls of other shapes round differently
        # (measured up to 1.8e-5 on a loaded CI machine); the old weights (x 1/1.3) would be far further off.
        torch.testing.assert_close(
            torch.tensor(after.sampler_logprobs), torch.tensor(r.sampler_logprobs[2:]), atol=1e-4, rtol=0
        )
    assert switched > 0 and sampler.policy_version == 1


def test_interruptible_rollouts_train_an_async_run_and_say_which_rollouts_a_publish_landed_in(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    extra = {"cluster.mode": "async", "rollout.interruptible": "true", "rollout.max_new_tokens": 16}
    result = train(load_config(None, _overrides(tmp_path, micro_model_dir, "interruptible", **extra)))
    assert result.steps == 4
    rows = [
        json.loads(line) for line in (tmp_path / "interruptible" / "metrics.jsonl").read_text().splitlines()
    ]
    assert all(0 <= r["staleness/interrupted_frac"] <= 1 for r in rows if r["step"] > 0)


def test_interruptible_is_refused_where_it_is_not_built() -> None:
    with pytest.raises(ValueError, match=r"rollout\.interruptible needs cluster\.mode: async"):
        load_config(None, ["rollout.interruptible=true"])


# --- N learner ranks: the gathered state against the shards --------------------------------------------


class _TwoRanks:
    """Rank 0 of two, whose peer reports `other` (what `Ranks.gather_stats` would bring back)."""

    rank, world = 0, 2

    def __init__(self, other: dict[str, tuple[int, bool]]) -> None:
        self.other = other

    def gather_stats(self, stats: list[dict[str, tuple[int, bool]]]) -> list[dict[str, tuple[int, bool]]]:
        return [*stats, self.other]


def test_a_gather_that_does_not_add_up_to_the_shards_is_caught() -> None:
    from hone.rl.ranks.learners import verify_gather

    model = torch.nn.Linear(4, 3, bias=False)
    full = model.weight.detach().clone()
    mine = (bit_sum(full), True)
    verify_gather(model, {"weight": full}, _TwoRanks({"weight": mine}))  # DDP: two equal replicas
    with pytest.raises(
        WeightMismatchError, match=r"gathered weight differs from what learner rank\(s\) \[1\]"
    ):
        verify_gather(model, {"weight": full}, _TwoRanks({"weight": (mine[0] + 1, True)}))
    # FSDP2: rank 0 holds rows 0-1 (a shard), rank 1 row 2; their sums add up to the gathered tensor's.
    model.weight.to_local = lambda: full[:2]  # type: ignore[attr-defined]
    verify_gather(model, {"weight": full}, _TwoRanks({"weight": (bit_sum(full[2:]), False)}))
    flipped = full.clone()
    _flip_bit(flipped, 11, 0)  # the gather damaged one element of rank 1's row
    with pytest.raises(WeightMismatchError, match="the gathered weight differs"):
        verify_gather(model, {"weight": flipped}, _TwoRanks({"weight": (bit_sum(full[2:]), False)}))

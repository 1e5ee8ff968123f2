"""TRL's reward contract run unchanged (issue 49): `fn(prompts=, completions=, completion_ids=, **columns)`
once per batch, `float | None` per completion, as TRL 1.16's GRPOTrainer calls it."""

from __future__ import annotations

import functools
import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from hone.algorithms.advantages import grpo
from hone.config import load_config
from hone.rewards import RewardScorer, reward_failed
from hone.rewards.resolve import load_reward, with_contract
from hone.rewards.scoring import RewardComponent
from hone.rewards.trl_contract import TrainerState, TrlReward, contract_of
from hone.rl.producer import drop_failed_rewards
from hone.types import Rollout, Sample
from tests import trl_rewards_for_tests as fns

MOD = "tests.trl_rewards_for_tests"


def rollout(sample_id: str, text: str, ids: tuple[int, ...] = (5, 6), group: int = 0) -> Rollout:
    return Rollout(sample_id, group, [1, 2, *ids], 2, [1] * len(ids), [-0.1] * len(ids), response_text=text)


def scorer(*overrides: str, answer_field: str = "answer", max_steps: int = 0) -> RewardScorer:
    components = any(o.startswith("reward.components") for o in overrides)
    cfg = load_config(None, ["reward.fn=null"] * components + list(overrides))
    return load_reward(cfg.reward, None, answer_field=answer_field, max_steps=max_steps)


TEXT = {"a": Sample("a", prompt="1+1=", answer="2", meta={"ground_truth": "2", "task": "math"})}
CHAT = {"c": Sample("c", messages=[{"role": "user", "content": "Think, then answer."}], answer="4")}


# --- which contract ---------------------------------------------------------------------------------


def hone_style(rollout: Rollout, sample: Sample) -> float:
    return 1.0


class CallableTrl:
    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        return [float(len(ids)) for ids in completion_ids]


def trl_with_factor(factor: float, completions: list[str], **kwargs: Any) -> list[float]:
    return [factor * len(c) for c in completions]


def test_contract_is_read_from_the_signature() -> None:
    assert contract_of(hone_style, "w") == "hone"
    assert contract_of(fns.reward_len, "w") == "trl"  # completions first
    assert contract_of(fns.trl_token_reward, "w") == "trl"  # **kwargs, no (rollout, sample) pair
    assert contract_of(CallableTrl(), "w") == "trl"  # a callable instance
    assert contract_of(functools.partial(trl_with_factor, 2.0), "w") == "trl"  # a partial
    assert contract_of(lambda r, s, **kw: 0.0, "w") == "hone"  # a positional pair wins over **kwargs
    assert contract_of(fns.reward_len, "w", "hone") == "hone"  # forced
    assert contract_of(hone_style, "w", "trl") == "trl"


def test_a_signature_fitting_neither_contract_is_one_line_naming_both() -> None:
    with pytest.raises(ValueError) as e:
        scorer(f"reward.fn={MOD}:neither")
    msg = str(e.value)
    assert "\n" not in msg and "Hone's contract" in msg and "TRL's" in msg and "'neither'" in msg


def test_one_log_line_per_function_says_its_contract(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hone"):
        scorer(
            f"reward.components.len.fn={MOD}:reward_len",
            "reward.components.mine.fn=tests.rewards_for_tests:token_id_reward",
            "reward.components.fmt.fn=format",
        )
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reward ")]
    assert lines == [
        "reward len: TRL contract (called once per batch with prompts, completions, completion_ids and the "
        "dataset's columns)",
        "reward mine: Hone contract (called once per response as fn(rollout, sample))",
    ]


def test_contract_key_forces_it_and_is_refused_on_a_built_in() -> None:
    s = scorer(f"reward.fn={MOD}:reward_len", "reward.contract=hone")
    assert not isinstance(s.components[0].fn, TrlReward)
    with pytest.raises(ValueError, match="built-in reward has Hone's contract"):
        scorer("reward.fn=format", "reward.contract=trl")
    with pytest.raises(ValueError, match=r"reward\.contract needs reward\.fn"):
        load_config(
            None, ["reward.fn=null", "reward.contract=trl", f"reward.components.x.fn={MOD}:reward_len"]
        )


# --- what a TRL function is passed ------------------------------------------------------------------


def test_kwargs_are_built_as_trl_builds_them() -> None:
    seen: dict[str, Any] = {}

    def spy(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        seen.update(kwargs, prompts=prompts, completions=completions)
        return [0.0] * len(completions)

    samples = {**TEXT, **CHAT, "b": Sample("b", prompt="x", answer=None, meta={"task": "code", "extra": 3})}
    s = RewardScorer([RewardComponent("spy", TrlReward("spy", spy, answer_column="solution"))])
    s.trainer_state.global_step, s.trainer_state.max_steps = 7, 10
    s.score([rollout("a", "2"), rollout("c", "ok", (9,)), rollout("b", "y")], samples)
    assert seen["prompts"] == ["1+1=", [{"role": "user", "content": "Think, then answer."}], "x"]
    assert seen["completions"] == ["2", [{"role": "assistant", "content": "ok"}], "y"]
    assert seen["completion_ids"] == [[5, 6], [9], [5, 6]]
    assert seen["ground_truth"] == ["2", None, None]
    assert seen["task"] == ["math", None, "code"] and seen["extra"] == [None, None, 3]
    assert seen["solution"] == ["2", "4", None]  # the answer under its dataset column's name
    assert "answer" not in seen
    assert (seen["trainer_state"].global_step, seen["trainer_state"].max_steps) == (7, 10)
    assert callable(seen["log_metric"]) and callable(seen["log_extra"])


def test_trl_docs_examples_run_unchanged() -> None:
    by_id = {
        "a": Sample("a", prompt="p", meta={"ground_truth": "4"}),
        "b": Sample("b", prompt="q", meta={"ground_truth": "5"}),
    }
    rs = [rollout("a", r"so \boxed{4}"), rollout("b", r"\boxed{4}"), rollout("a", "x" * 18)]
    s = scorer(
        f"reward.components.len.fn={MOD}:reward_len",
        f"reward.components.acc.fn={MOD}:reward_func",
        "reward.components.acc.weight=2.0",
    )
    metrics = s.score(rs, by_id)
    lens = [-abs(20 - len(r.response_text)) for r in rs]
    assert [r.reward for r in rs] == [lens[0] + 2.0, lens[1], lens[2]]
    assert [r.reward_parts for r in rs] == [
        {"len": lens[0], "acc": 1.0},
        {"len": lens[1], "acc": 0.0},
        {"len": -2.0, "acc": 0.0},
    ]
    assert metrics["rewards/acc/mean"] == pytest.approx(1 / 3)
    assert metrics["rewards/len/mean"] == pytest.approx(sum(lens) / 3)
    mean = sum(lens) / 3
    assert metrics["rewards/len/std"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in lens) / 2))
    assert metrics["reward/len"] == metrics["rewards/len/mean"]  # Hone's name beside TRL's

    chat = scorer(f"reward.fn={MOD}:format_reward_func")
    rs = [rollout("c", "<think>hm</think><answer>4</answer>"), rollout("c", "4")]
    chat.score(rs, CHAT)
    assert [r.reward for r in rs] == [1.0, 0.0]

    asyncs = scorer(
        f"reward.components.a.fn={MOD}:async_len_reward", f"reward.components.b.fn={MOD}:reward_len"
    )
    rs = [rollout("a", "abc")]
    asyncs.score(rs, TEXT)
    assert rs[0].reward == 3.0 + -17.0


def test_trl_style_and_hone_style_give_the_same_rewards() -> None:
    from tests.rewards_for_tests import token_id_reward

    rs_trl = [rollout("a", "t", ids) for ids in [(1, 2), (3, 9, 4), (6,), (0, 0, 1)]]
    rs_hone = [rollout("a", "t", ids) for ids in [(1, 2), (3, 9, 4), (6,), (0, 0, 1)]]
    m_trl = scorer(f"reward.fn={MOD}:trl_token_reward").score(rs_trl, TEXT)
    m_hone = scorer("reward.fn=tests.rewards_for_tests:token_id_reward").score(rs_hone, TEXT)
    assert (
        [r.reward for r in rs_trl]
        == [r.reward for r in rs_hone]
        == [token_id_reward(r, TEXT["a"]) for r in rs_hone]
    )
    assert m_trl["reward/mean"] == m_hone["reward/mean"]


def test_log_metric_and_log_extra_land_in_the_metrics_and_records() -> None:
    s = scorer(f"reward.fn={MOD}:trl_token_reward")
    s.trainer_state.global_step = 3
    rs = [rollout("a", "t", (1, 2)), rollout("a", "t", (1, 1))]
    metrics = s.score(rs, TEXT)
    assert metrics["trl_test/step"] == 3.0
    assert [r.extra for r in rs] == [{"parity": "odd"}, {"parity": "even"}]


def test_wrong_length_is_one_line_naming_the_function_and_both_lengths(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = scorer(f"reward.fn={MOD}:wrong_length")
    rs = [rollout("a", "x"), rollout("a", "y")]
    s.score(rs, TEXT)
    assert all(reward_failed(r) for r in rs)
    assert (
        str(s.last_error)
        == "reward 'wrong_length' (TRL contract) returned 3 rewards for 2 completions (one per completion)"
    )


def test_trl_built_in_rewards_by_dotted_name() -> None:
    pytest.importorskip("trl")
    think = scorer("reward.fn=trl.rewards:think_format_reward")
    rs = [rollout("c", "<think>\nreason\n</think>\nanswer"), rollout("c", "no think")]
    metrics = think.score(rs, CHAT)
    assert [r.reward for r in rs] == [1.0, 0.0]
    assert metrics["rewards/think_format_reward/mean"] == 0.5

    pytest.importorskip("math_verify")
    by_id = {
        "m": Sample("m", messages=[{"role": "user", "content": "1/3?"}], answer=r"$\frac{1}{3}$"),
        "u": Sample("u", messages=[{"role": "user", "content": "?"}], answer="no math here"),
    }
    acc = scorer("reward.fn=trl.rewards:accuracy_reward", answer_field="solution")
    rs = [rollout("m", r"It is \boxed{\frac{1}{3}}"), rollout("m", r"\boxed{\frac{1}{2}}"), rollout("u", "x")]
    metrics = acc.score(rs, by_id)
    assert [r.reward for r in rs[:2]] == [1.0, 0.0]
    assert not reward_failed(rs[0]) and reward_failed(rs[2])  # gold unparseable: None, unscorable
    assert metrics["reward/unscorable"] == 1.0 and metrics["rewards/accuracy_reward/mean"] == 0.5
    assert rs[0].extra["gold_parsed"] != "[unparseable]" and rs[2].extra["answer_parsed"] == "[skipped]"

    rep = scorer("reward.fn=trl.rewards:get_repetition_penalty_reward", "reward.args={ngram_size: 2}")
    rs = [rollout("a", "x", (1, 2, 3, 4)), rollout("a", "y", (5, 5, 5, 5, 5))]
    rep.score(rs, TEXT)
    assert [r.reward for r in rs] == [0.0, -0.75]  # TRL's docstring example


# --- None: sum over the functions that answered; all-None is unscorable -------------------------------


def test_none_sums_over_the_functions_that_answered_and_unscorable_leaves_the_baseline() -> None:
    by_id = {
        "m": Sample("m", prompt="p", meta={"task": "math"}),
        "c": Sample("c", prompt="q", meta={"task": "code"}),
        "o": Sample("o", prompt="r", meta={"task": "other"}),
    }
    s = scorer(
        f"reward.components.ml.fn={MOD}:math_len_reward",
        f"reward.components.code.fn={MOD}:code_reward",
        "reward.components.code.weight=0.5",
    )
    # One group of four: math "ab" -> 2, code "def f" -> 0.5 * 1, other -> unscorable, math "abcd" -> 4.
    rs = [rollout("m", "ab"), rollout("c", "def f"), rollout("o", "zz"), rollout("m", "abcd")]
    metrics = s.score(rs, by_id)
    assert [r.reward for r in rs[:2]] + [rs[3].reward] == [2.0, 0.5, 4.0]
    assert rs[0].reward_parts == {"ml": 2.0} and rs[1].reward_parts == {"code": 1.0}
    assert [reward_failed(r) for r in rs] == [False, False, True, False]
    assert metrics["reward/unscorable"] == 1.0 and metrics["reward/errors"] == 0.0
    assert metrics["rewards/ml/mean"] == 3.0 and metrics["rewards/code/mean"] == 1.0
    assert metrics["rewards/code/std"] != metrics["rewards/code/std"]  # one value: NaN, as TRL's nanstd
    assert metrics["reward/mean"] == pytest.approx(6.5 / 3)  # over the scorable ones

    kept, excluded = drop_failed_rewards(rs)
    assert excluded == 0.25 and rs[2] not in kept
    rewards = torch.tensor([r.reward for r in kept])
    adv, _ = grpo(token_rewards=rewards[:, None], response_mask=torch.ones(3, 1), group_ids=torch.zeros(3))
    # Hand-computed: the baseline is over {2, 0.5, 4} only: mean 13/6; squared deviations 1/36, 100/36,
    # 121/36, so the unbiased std is sqrt((222/36) / 2) = sqrt(37/12). (Had the unscorable one counted
    # as 0, the mean would be 1.625.)
    mean, std = 13 / 6, math.sqrt(37 / 12)
    assert [(2 - mean) / std, (0.5 - mean) / std, (4 - mean) / std] == pytest.approx(
        adv[:, 0].tolist(), abs=1e-5
    )
    assert adv[:, 0].tolist() == pytest.approx([-0.0949158, -0.9491580, 1.0440738], abs=1e-6)
    # The unscorable completion: no advantage (not trained on), and the others' baseline never saw its 0.


def test_a_none_from_a_hone_contract_reward_is_still_an_error() -> None:
    s = RewardScorer([RewardComponent("h", lambda r, s: None)])  # type: ignore[arg-type, return-value]
    rs = [rollout("a", "x")]
    metrics = s.score(rs, TEXT)
    assert metrics["reward/errors"] == 1.0 and "reward/unscorable" not in metrics


def test_hone_rewards_log_no_trl_metrics() -> None:
    s = scorer("reward.fn=tests.rewards_for_tests:token_id_reward")
    metrics = s.score([rollout("a", "x")], TEXT)
    assert set(metrics) == {"reward/errors", "reward/timeouts", "reward/mean"}


def test_trainer_state_is_shared_with_every_trl_component() -> None:
    s = scorer(
        f"reward.components.a.fn={MOD}:reward_len",
        f"reward.components.b.fn={MOD}:trl_token_reward",
        max_steps=9,
    )
    states = {id(c.fn.state) for c in s.components if isinstance(c.fn, TrlReward)}
    assert states == {id(s.trainer_state)} and s.trainer_state == TrainerState(0, 9)
    assert with_contract("x", "format", "fn", "auto") == "fn"  # a built-in is left as it is


# --- a run -------------------------------------------------------------------------------------------


def test_a_run_with_a_trl_reward_logs_trl_metric_names(tmp_path: Path, micro_model_dir: Path) -> None:
    from hone.rl.loop import train
    from tests.helpers import tiny_overrides

    overrides = tiny_overrides(
        tmp_path,
        micro_model_dir,
        "trl",
        **{"run.steps": 2, "run.eval_every": 0, "reward.fn": f"{MOD}:trl_token_reward", "logging.samples": 2},
    )
    train(load_config(None, overrides))
    rows = [json.loads(line) for line in (tmp_path / "trl" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "rewards/trl_token_reward/mean" in row]
    assert len(steps) == 2
    assert [row["trl_test/step"] for row in steps] == [0.0, 1.0]
    records = [json.loads(line) for line in (tmp_path / "trl" / "samples.jsonl").read_text().splitlines()]
    assert records and all(r["extra"]["parity"] in ("odd", "even") for r in records)


def test_a_steps_scoring_round_awaits_async_trl_rewards_beside_sync_ones() -> None:
    import asyncio

    s = scorer(
        f"reward.components.a.fn={MOD}:async_len_reward",
        f"reward.components.b.fn={MOD}:reward_len",
        "reward.components.c.fn=tests.rewards_for_tests:token_id_reward",
    )
    rs = [rollout("a", "abc", (1, 2)), rollout("a", "abcdef", (3,))]

    async def step() -> dict[str, float]:
        scoring = s.round(TEXT)
        scoring.submit(rs[:1])  # a per-rollout component started early, as a multi-turn episode ends
        return await scoring.finish(rs)

    metrics = asyncio.run(step())
    assert [r.reward for r in rs] == [3.0 - 17.0 + 3.0, 6.0 - 14.0 + 3.0]
    assert metrics["rewards/a/mean"] == 4.5 and "rewards/c/mean" not in metrics

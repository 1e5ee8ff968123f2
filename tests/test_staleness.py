"""`cluster.max_staleness: auto`: the controller's rule on hand-made step metrics, the importance-weight
ESS it reads, and an asynchronous run that logs the limit it admitted at every step."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from hone.algorithms.metrics import importance_ess, offpolicy_ess
from hone.config import load_config
from hone.rl.loop import train
from hone.rl.placement.staleness import HOLD, StalenessController
from tests.helpers import TOKEN_REWARD, tiny_overrides


def test_importance_ess_by_hand() -> None:
    assert importance_ess(4.0, 4.0, 4) == 1.0  # four weights of 1: on-policy
    # weights 2, 0, 0, 0 (sum 2, squares 4): (2^2) / (4 * 4) = 0.25, one of four samples effective
    assert importance_ess(2.0, 4.0, 4) == 0.25
    assert importance_ess(0.0, 0.0, 0) == 1.0


def test_sequence_ess_compounds_what_the_token_ess_hides() -> None:
    # Token weights 2, 1, 1, 1: (5^2) / (4 * 7) = 25/28. Sequences: e^(ln 2 + 0) = 2 and 1: 9 / (2 * 5).
    log_ratio = torch.tensor([[math.log(2.0), 0.0], [0.0, 0.0]])
    metrics = offpolicy_ess(log_ratio, torch.ones(2, 2))
    assert metrics["offpolicy/ess"] == pytest.approx(25 / 28)
    assert metrics["offpolicy/ess_seq"] == pytest.approx(9 / 10)
    # A small drift on every token of long responses: the token ESS stays near 1, the sequences' falls.
    drift = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)) * 0.15
    metrics = offpolicy_ess(drift, torch.ones(64, 32))
    assert metrics["offpolicy/ess"] > 0.97 and metrics["offpolicy/ess_seq"] < 0.7


def _steps(controller: StalenessController, n: int, **metrics: float) -> list[int]:
    return [controller.update(dict(metrics)) for _ in range(n)]


def test_eta_grows_by_one_while_the_learner_waits_and_the_weights_stay_on_policy() -> None:
    controller = StalenessController(cap=3)
    limits = _steps(controller, 4 * (HOLD + 1), **{"time/learner_idle_frac": 0.4, "offpolicy/ess_seq": 0.99})
    assert limits[0] == 1 and limits[-1] == 3  # +1 every HOLD + 1 steps, stopped at the cap
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(limits))


def test_eta_stays_when_the_learner_never_waits() -> None:
    controller = StalenessController(cap=8)
    assert set(_steps(controller, 20, **{"time/learner_idle_frac": 0.0, "offpolicy/ess_seq": 1.0})) == {1}


def test_eta_halves_when_the_importance_weights_degrade() -> None:
    controller = StalenessController(cap=8, limit=6)
    limits = _steps(controller, HOLD + 1, **{"time/learner_idle_frac": 0.5, "offpolicy/ess_seq": 0.5})
    assert limits[-1] == 3
    limits = _steps(controller, 2 * (HOLD + 1), **{"time/learner_idle_frac": 0.5, "offpolicy/ess_seq": 0.5})
    assert limits[-1] == 0  # 3 -> 1 -> 0: synchronous


def test_eta_halves_when_the_reward_turns_down() -> None:
    controller = StalenessController(cap=8, limit=4)
    rewards = [0.5 + 0.01 * k for k in range(30)] + [0.2] * 5  # rising, then a fall
    limits = [
        controller.update({"reward/mean": r, "time/learner_idle_frac": 0.0, "offpolicy/ess_seq": 1.0})
        for r in rewards
    ]
    assert limits[29] == 4 and limits[-1] == 2


@pytest.mark.parametrize("mode", ["async"])
def test_an_auto_run_logs_the_limit_and_its_staleness_stays_under_it(
    tmp_path: Path, micro_model_dir: Path, mode: str
) -> None:
    overrides = tiny_overrides(
        tmp_path,
        micro_model_dir,
        "auto",
        **{
            "run.steps": 6,
            "run.save_every": 0,
            "run.eval_every": 0,
            "cluster.mode": mode,
            "cluster.max_staleness": "auto",
            "cluster.max_staleness_cap": 2,
            **TOKEN_REWARD,
        },
    )
    train(load_config(None, overrides))
    rows = [json.loads(line) for line in (tmp_path / "auto" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "staleness/limit" in r]
    assert len(steps) == 6
    assert all(0 <= r["staleness/limit"] <= 2 for r in steps)
    assert all(0 < r["offpolicy/ess"] <= 1 and 0 < r["offpolicy/ess_seq"] <= 1 for r in steps)
    assert all(r["staleness/max"] <= 2 for r in steps)


def test_a_negative_limit_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="max_staleness must be >= 0 or auto"):
        load_config(None, ["cluster.max_staleness=-1"])

"""What TRL's reward contract costs beside Hone's own (issue 49: "the adapter costs nothing measurable").

One step's scoring of `vs_trl.py`'s tiny workload (16 prompts x 8 responses) by the same check, Hone's
math verifier, written both ways: Hone's `fn(rollout, sample)` per response (`reward.fn: math`), and
TRL's `fn(completions, answer, **kwargs)` once per batch (`reward.contract: trl`, what a TRL user brings).
Both go through `RewardScorer.score`, alternating, `ROUNDS` times each; the medians and their ratio, and
the difference as a share of vs_trl's tiny step (measured by `vs_trl.py`, passed as `--step-s`).

    .venv/bin/python bench/trl_reward_overhead.py   # ~30 s; bench/results/trl_reward_overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from hone.config import load_config
from hone.data.splits import load_task
from hone.rewards.resolve import load_reward
from hone.types import Rollout, Sample
from hone.verifiers.math import math_reward

ROUNDS = 200
PROMPTS, N = 16, 8
RESULTS = Path(__file__).parent / "results" / "trl_reward_overhead.json"


def trl_math(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """The same check as `reward.fn: math` on the arithmetic task, written as TRL's docs write rewards."""
    return [math_reward(c, a, require_evaluated=True) for c, a in zip(completions, answer, strict=True)]


def batch() -> tuple[list[Rollout], dict[str, Sample]]:
    """A step's rollouts: half right, half wrong, a few unevaluated expressions (the task's traps)."""
    samples = {f"p{k}": Sample(f"p{k}", prompt=f"{k}+{k}=", answer=str(2 * k)) for k in range(PROMPTS)}
    rollouts = []
    for k in range(PROMPTS):
        for j in range(N):
            text = [str(2 * k), str(2 * k + 1), f"{k}+{k}", f"the answer is {2 * k}"][j % 4]
            rollouts.append(Rollout(f"p{k}", k, [1, 2, 3, 4], 2, [1, 1], [-0.1, -0.1], response_text=text))
    return rollouts, samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--step-s", type=float, default=None, help="vs_trl's tiny median step, for the share")
    ns = parser.parse_args()
    scorers = {}
    for arm, overrides in {
        "hone": ["data.task=arithmetic", "reward.fn=math"],
        "trl": ["data.task=arithmetic", "reward.fn=trl_reward_overhead:trl_math", "reward.contract=trl"],
    }.items():
        cfg = load_config(None, overrides)
        scorers[arm] = load_reward(cfg.reward, load_task(cfg.data), answer_field=cfg.data.answer_field)
    rollouts, samples = batch()
    seconds: dict[str, list[float]] = {arm: [] for arm in scorers}
    rewards: dict[str, list[float]] = {}
    for k in range(ROUNDS):
        for arm in list(scorers)[k % 2 :] + list(scorers)[: k % 2]:
            started = time.perf_counter()
            scorers[arm].score(rollouts, samples)
            seconds[arm].append(time.perf_counter() - started)
            rewards[arm] = [r.reward for r in rollouts]
    assert rewards["hone"] == rewards["trl"], "the two arms must score the same"
    med = {arm: statistics.median(s) for arm, s in seconds.items()}
    result: dict[str, Any] = {
        "rollouts": len(rollouts),
        "rounds": ROUNDS,
        "median_ms": {arm: 1000 * m for arm, m in med.items()},
        "trl_over_hone": med["trl"] / med["hone"],
        "difference_ms": 1000 * (med["trl"] - med["hone"]),
    }
    if ns.step_s:
        result["difference_share_of_step"] = (med["trl"] - med["hone"]) / ns.step_s
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

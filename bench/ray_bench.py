"""The Ray back-end on this machine: publish time per weight version and throughput with 1 vs 2 sampler
actors, against the local run, same recipe (the demo's tiny model and task, no SFT, 30 RL steps).

    .venv/bin/python bench/ray_bench.py     # ~3 minutes

Trajectories/s counts trained rollouts over the RL wall time (first step begun to last step done). The
publish time is `RayRollouts.publish` as the learner sees it: one `ray.put` of the weights plus the load
calls (asynchronous: the actors load before their next share).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

from hone.config import load_config
from hone.orchestration import loop
from hone.orchestration.ray_backend import RayRollouts

STEPS = 30
ARMS: list[tuple[str, dict[str, object]]] = [
    ("local (sync)", {}),
    ("ray, 1 sampler actor", {"cluster.backend": "ray", "cluster.samplers.count": 1}),
    ("ray, 2 sampler actors", {"cluster.backend": "ray", "cluster.samplers.count": 2}),
]


def run(name: str, extra: dict[str, object], run_dir: str) -> dict[str, Any]:
    overrides = {
        "run.dir": run_dir,
        "run.name": name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", ""),
        "run.steps": STEPS,
        "run.eval_every": 0,
        "run.time_limit_s": "null",
        "sft.enabled": "false",
        "logging.progress": "false",
        "logging.tensorboard": "false",
        "algorithm.skip_zero_variance_groups": "false",
        **extra,
    }
    cfg = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    times: list[float] = []
    publishes: list[float] = []
    real_step, real_publish = loop.rl_step, RayRollouts.publish

    def step(s: int, rollouts: Any, learner: Any) -> dict[str, float]:
        times.append(time.perf_counter())
        out = real_step(s, rollouts, learner)
        times.append(time.perf_counter())
        return out

    def publish(self: RayRollouts, version: int) -> None:
        t0 = time.perf_counter()
        real_publish(self, version)
        publishes.append(time.perf_counter() - t0)

    loop.rl_step, RayRollouts.publish = step, publish  # type: ignore[method-assign]
    try:
        loop.train(cfg)
    finally:
        loop.rl_step, RayRollouts.publish = real_step, real_publish  # type: ignore[method-assign]
    wall = times[-1] - times[0]
    return {
        "arm": name,
        "steps_per_s": STEPS / wall,
        "trajectories_per_s": STEPS * cfg.data.prompts_per_step * cfg.rollout.n / wall,
        "publish_ms": 1000 * statistics.fmean(publishes[1:]) if len(publishes) > 1 else None,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as run_dir:
        results = [run(name, extra, run_dir) for name, extra in ARMS]
    base = results[0]["trajectories_per_s"]
    print(f"{'arm':>24} {'steps/s':>8} {'traj/s':>8} {'ratio':>6} {'publish ms':>11}")
    for r in results:
        publish = "-" if r["publish_ms"] is None else f"{r['publish_ms']:.1f}"
        print(
            f"{r['arm']:>24} {r['steps_per_s']:>8.2f} {r['trajectories_per_s']:>8.1f} "
            f"{r['trajectories_per_s'] / base:>5.2f}x {publish:>11}"
        )


if __name__ == "__main__":
    main()

"""The Ray back-end on this machine: publish time per weight version and throughput with 1 vs 2 sampler
actors, against the local run, same recipe (the demo's tiny model and task, no SFT, 30 RL steps).

    .venv/bin/python bench/ray_bench.py     # ~2 minutes; sampler actors get 1 CPU each (the default)

Read from each run's metrics.jsonl, as a user would: trajectories/s counts trained rollouts over the sum
of the steps' `time/step_s` (the learner's RL wall time, Ray's start and the eval left out); the publish
time is `time/publish_s` as the learner sees it (on Ray: one `ray.put` of the weights plus the load calls,
which are asynchronous: the actors load before their next share), over steps 2.. (the first pays warm-up).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from hone.config import load_config
from hone.rl import loop

STEPS = 30
ARMS: list[tuple[str, dict[str, object]]] = [
    ("local (sync)", {}),
    ("ray, 1 sampler", {"cluster.backend": "ray"}),  # the learner runs in the driver, on its threads
    ("ray, 2 samplers", {"cluster.backend": "ray", "cluster.samplers.count": 2}),
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
    result = loop.train(cfg)
    rows = [json.loads(line) for line in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step_s" in r]
    wall = sum(r["time/step_s"] for r in steps)
    return {
        "arm": name,
        "steps_per_s": len(steps) / wall,
        "trajectories_per_s": len(steps) * cfg.data.prompts_per_step * cfg.rollout.n / wall,
        "publish_ms": 1000 * statistics.fmean(r["time/publish_s"] for r in steps[1:]),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as run_dir:
        results = [run(name, extra, run_dir) for name, extra in ARMS]
    base = results[0]["trajectories_per_s"]
    print(f"{'arm':>32} {'steps/s':>8} {'traj/s':>8} {'ratio':>6} {'publish ms':>11}")
    for r in results:
        print(
            f"{r['arm']:>32} {r['steps_per_s']:>8.2f} {r['trajectories_per_s']:>8.1f} "
            f"{r['trajectories_per_s'] / base:>5.2f}x {r['publish_ms']:>11.1f}"
        )


if __name__ == "__main__":
    main()

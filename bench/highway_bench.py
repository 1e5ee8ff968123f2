"""highway-env in one run: a random policy against `recipes/highway-ppo.yaml`'s trained PPO policy.

Both play the same `--episodes` episodes of highway-fast-v0 (highway-env, pure Python; episode i reset
with seed 20_000 + i, none of which training sees), and the table reports each one's mean return and
collision rate (`info["crashed"]` on an episode's last step). The random policy draws uniformly from the 5
meta-actions; the trained one acts deterministically (argmax). Training is the recipe's setting (highway-env's
own SB3 PPO script) with `--env-steps` environment steps; `--backend envpool` trains on envpool's C++ port
of highway-fast-v0 instead, still evaluated on highway-env itself. CPU-seconds are `time.process_time`.

    .venv/bin/python bench/highway_bench.py                    # 20k training steps, 30 episodes each
    .venv/bin/python bench/highway_bench.py --env-steps 3072 --episodes 5     # a quick check
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

SEED0 = 20_000  # the benchmark's episodes; training seeds its envs from run.seed (0) and eval from 10_000


def play(env: Any, act: Any, episodes: int) -> dict[str, float]:
    """`episodes` episodes with `act(obs) -> action`: mean return, collision rate, mean length."""
    returns, crashed, lengths = [], [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=SEED0 + i)
        total, length, done, info = 0.0, 0, False, {}
        while not done:
            obs, reward, terminated, truncated, info = env.step(act(obs))
            total, length, done = total + float(reward), length + 1, bool(terminated or truncated)
        returns.append(total)
        crashed.append(float(info["crashed"]))
        lengths.append(length)
    return {
        "return": float(np.mean(returns)),
        "return_std": float(np.std(returns)),
        "collision_rate": float(np.mean(crashed)),
        "length": float(np.mean(lengths)),
        "episodes": episodes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--env-steps", type=int, default=20_000)
    parser.add_argument("--backend", choices=["sync", "envpool"], default="sync")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "highway_bench.json")
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file

    from hone.config import load_config
    from hone.control.envs import make_eval_env
    from hone.control.evaluate import POLICY_FILE
    from hone.control.loops import train_control
    from hone.control.policy import ActorCritic
    from hone.tracking import read_metrics

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"run.dir={tmp}",
            "run.threads=1",
            f"control.env_steps={args.env_steps}",
            f"control.vectorization={args.backend}",
            "control.eval_episodes=1",
            "logging.progress=false",
            "logging.tensorboard=false",
            "logging.plot=[]",
        ]
        cfg = load_config("highway-ppo", overrides)
        control = cfg.control
        assert control is not None
        env = make_eval_env(control)
        rng = np.random.default_rng(0)
        cpu = time.process_time()
        random = play(env, lambda _obs: int(rng.integers(env.action_space.n)), args.episodes)
        random["cpu_s"] = time.process_time() - cpu

        cpu, wall = time.process_time(), time.perf_counter()
        result = train_control(cfg)
        train_cpu, train_wall = time.process_time() - cpu, time.perf_counter() - wall
        last = read_metrics(result.run_dir / "metrics.jsonl")[-1]

        policy = ActorCritic(env.observation_space.shape[0], env.action_space, control.hidden_sizes)
        policy.load_state_dict(load_file(str(result.run_dir / "model" / POLICY_FILE)))

        def greedy(obs: np.ndarray) -> int:
            with torch.no_grad():
                return int(policy.act(torch.as_tensor(obs, dtype=torch.float32)[None], deterministic=True)[0])

        cpu = time.process_time()
        trained = play(env, greedy, args.episodes)
        trained["cpu_s"] = time.process_time() - cpu
        env.close()
    report = {
        "env": control.env,
        "backend": args.backend,
        "train_env_steps": result.env_steps,
        "train_cpu_s": train_cpu,
        "train_wall_s": train_wall,
        "train_last100": {k: last.get(k) for k in ("episode/return", "episode/crashed", "episode/length")},
        "random": random,
        "ppo": trained,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\n{control.env}, {args.episodes} episodes each (seeds {SEED0}..), PPO trained {result.env_steps} "
        f"steps on {args.backend} in {train_cpu:.0f} CPU-s ({train_wall:.0f} s wall)"
    )
    print("| policy | mean return (± std) | collision rate | mean length |")
    print("|---|---|---|---|")
    for name, row in (("random", random), ("PPO (highway-ppo)", trained)):
        print(
            f"| {name} | {row['return']:.1f} ± {row['return_std']:.1f} | {row['collision_rate']:.0%} "
            f"| {row['length']:.1f} |"
        )


if __name__ == "__main__":
    main()

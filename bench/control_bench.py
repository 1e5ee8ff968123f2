"""PPO on CartPole-v1: Hone's control loop against Stable-Baselines3 2.9, same hyperparameters, same machine.

The setting is rl-baselines3-zoo's (hyperparams/ppo.yml, CartPole-v1): 8 envs × 32 steps, one mini-batch
of 256, 20 epochs, gamma 0.98, lambda 0.8, learning rate lin 1e-3, clip lin 0.2, no entropy bonus,
gradient clip 0.5, 64×64 tanh MLPs, orthogonal init. A run stops when the mean return of its last 100
training episodes reaches 475 (both: the last 100 completed episodes, counted once 100 exist), or at
100k environment steps. Each run is its own process with one torch thread; Hone and SB3 alternate seed by
seed so a load change on the machine hits both. CPU-seconds (`time.process_time`) are counted from
building the model to the end of training (imports excluded), the reliable number on a shared machine.

Target (issue 32): every seed reaches 475 within 100k steps, and Hone's CPU-seconds to get there are at
most 1.0× SB3's (summed over seeds).

    .venv/bin/python bench/control_bench.py                 # 3 seeds each (~3 CPU-minutes in all)
    .venv/bin/python bench/control_bench.py --seeds 0       # one seed each
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET, BUDGET = 475.0, 100_000


def run_hone(seed: int) -> dict[str, float]:
    from hone.config import load_config
    from hone.orchestration.control_loop import train_control
    from hone.tracking import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"run.dir={tmp}",
            f"run.seed={seed}",
            "run.eval_every=0",
            "run.threads=1",
            f"control.env_steps={BUDGET}",
            f"control.stop_at_return={TARGET}",
            "control.eval_episodes=1",
            "logging.progress=false",
            "logging.tensorboard=false",
            "logging.plot=[]",
        ]
        cfg = load_config("cartpole-ppo", overrides)
        cpu = time.process_time()
        result = train_control(cfg)
        cpu = time.process_time() - cpu
        last = read_metrics(result.run_dir / "metrics.jsonl")[-1]
    return {"env_steps": result.env_steps, "cpu_s": cpu, "return100": last.get("episode/return", 0.0)}


def run_sb3(seed: int) -> dict[str, float]:
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)

    class StopAtTarget(BaseCallback):
        def _on_step(self) -> bool:
            buffer = self.model.ep_info_buffer
            return not (len(buffer) == buffer.maxlen and np.mean([e["r"] for e in buffer]) >= TARGET)

    def linear(start: float):
        return lambda remaining: remaining * start

    cpu = time.process_time()
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        ent_coef=0.0,
        max_grad_norm=0.5,
        seed=seed,
        device="cpu",
    )
    model.learn(total_timesteps=BUDGET, callback=StopAtTarget())
    cpu = time.process_time() - cpu
    returns = [e["r"] for e in model.ep_info_buffer]
    return {"env_steps": model.num_timesteps, "cpu_s": cpu, "return100": float(np.mean(returns))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--one", choices=["hone", "sb3"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps((run_hone if args.one == "hone" else run_sb3)(args.seed)))
        return
    rows: dict[str, list[dict[str, float]]] = {"hone": [], "sb3": []}
    for seed in args.seeds:
        for impl in ("hone", "sb3"):
            out = subprocess.run(
                [sys.executable, __file__, "--one", impl, "--seed", str(seed)],
                capture_output=True,
                text=True,
                check=True,
                cwd=Path(__file__).parents[1],
            ).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows[impl].append(row)
            solved = "solved" if row["return100"] >= TARGET else "NOT solved"
            print(
                f"{impl:5s} seed {seed}: {solved} at {row['env_steps']:>7,} env steps, "
                f"{row['cpu_s']:6.1f} CPU-s, last-100 return {row['return100']:.1f}",
                flush=True,
            )
    cpu = {impl: sum(r["cpu_s"] for r in runs) for impl, runs in rows.items()}
    all_solved = all(r["return100"] >= TARGET for runs in rows.values() for r in runs)
    print(f"\nall seeds solved within {BUDGET:,} steps: {all_solved}")
    print(f"CPU-seconds, summed over seeds: Hone {cpu['hone']:.1f}, SB3 {cpu['sb3']:.1f}, ratio "
          f"{cpu['hone'] / cpu['sb3']:.2f}x (target <= 1.0x)")
    steps = {impl: sum(r["env_steps"] for r in runs) for impl, runs in rows.items()}
    per_k = {impl: 1000 * cpu[impl] / steps[impl] for impl in rows}
    print(f"where it goes: env steps to 475, Hone {steps['hone']:,} vs SB3 {steps['sb3']:,} "
          f"({steps['hone'] / steps['sb3']:.2f}x); CPU-s per 1k env steps, Hone {per_k['hone']:.3f} vs SB3 "
          f"{per_k['sb3']:.3f} ({per_k['hone'] / per_k['sb3']:.2f}x)")


if __name__ == "__main__":
    main()

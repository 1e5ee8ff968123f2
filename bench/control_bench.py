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

`--pendulum-sac`: SAC on Pendulum-v1, Hone (`recipes/pendulum-sac.yaml`) against SB3's SAC with the same
hyperparameters (rl-baselines3-zoo: lr 1e-3, the rest SB3's defaults: buffer 1e6, learning_starts 100,
batch 256, tau 0.005, gamma 0.99, train_freq 1, gradient_steps 1, automatic α from 1.0, target entropy
-|A|, 256×256 ReLU MLPs), one env, 20k environment steps, one seed each by default. Reported: the
deterministic eval return at 20k steps (10 episodes on the same fixed seeds, `EVAL_SEED + i`, for both;
target ≥ -200) and CPU-seconds per environment step (model building, training and that one eval).

    .venv/bin/python bench/control_bench.py --pendulum-sac              # seed 0 each (~8 CPU-minutes)

`--halfcheetah-sac`: SAC on HalfCheetah-v5 for a CPU budget, since 1M steps (CleanRL's 9,635) is ~4.5
CPU-hours here: both with rl-baselines3-zoo's HalfCheetah SAC setting (SB3's defaults: lr 3e-4 for actor,
critics and α, one update per step, batch 256, buffer 1e6; 10k random steps; Hone's `halfcheetah-sac` recipe
with `q_lr` and `policy_delay` set to SB3's), 100k environment steps (~30 CPU-minutes each), eval return
at the end on the same 10 seeded episodes.

    .venv/bin/python bench/control_bench.py --halfcheetah-sac           # seed 0 each (~1 CPU-hour)

`--hopper-td3`: TD3 on Hopper-v5 the same way, 50k environment steps, rl-baselines3-zoo's Hopper TD3 setting
(lr 1e-3, 10k random steps, Gaussian exploration noise 0.1, SB3's defaults otherwise) with 256x256 networks
on both sides.

    .venv/bin/python bench/control_bench.py --hopper-td3

`--quick`: a CI-sized check that both sides still run and learn (CartPole PPO, seed 0 each; Pendulum SAC
for 2k steps each, no target): about a CPU-minute.

    .venv/bin/python bench/control_bench.py --quick
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
SAC_EVAL_EPISODES = 10
# Per task: Hone's recipe and overrides, SB3's SAC arguments (the same setting), the env-step budget.
SAC_TASKS: dict[str, dict] = {
    "pendulum": {
        "recipe": "pendulum-sac",
        "env": "Pendulum-v1",
        "steps": 20_000,
        "target": -200.0,
        "hone": [],
        "sb3": {"learning_rate": 1e-3, "learning_starts": 100},
    },
    "halfcheetah": {
        "recipe": "halfcheetah-sac",
        "env": "HalfCheetah-v5",
        "steps": 100_000,
        "target": None,  # no bar: how far each gets on the same budget
        "hone": [
            "control.lr=3e-4",
            "control.offpolicy.q_lr=null",
            "control.offpolicy.policy_delay=1",
            "control.offpolicy.learning_starts=10000",
        ],
        "sb3": {"learning_rate": 3e-4, "learning_starts": 10_000},
    },
    # TD3: rl-baselines3-zoo's Hopper setting (SB3's defaults, lr 1e-3, 10k random steps, Gaussian
    # exploration noise 0.1) with Hone's recipe networks (256x256 on both sides; SB3's default is 400x300).
    "hopper-td3": {
        "recipe": "hopper-td3",
        "env": "Hopper-v5",
        "steps": 50_000,
        "target": None,
        "algo": "td3",
        "hone": ["control.lr=1e-3", "control.offpolicy.learning_starts=10000"],
        "sb3": {"learning_rate": 1e-3, "learning_starts": 10_000, "policy_kwargs": {"net_arch": [256, 256]}},
    },
}


def run_hone(seed: int) -> dict[str, float]:
    from hone.config import load_config
    from hone.control.loops import train_control
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


def run_hone_sac(seed: int, task: str = "pendulum", steps: int | None = None) -> dict[str, float]:
    from hone.config import load_config
    from hone.control.loops import train_control

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"run.dir={tmp}",
            f"run.seed={seed}",
            "run.eval_every=0",
            "run.save_every=0",  # the final checkpoint only (SB3 writes none)
            "run.threads=1",
            f"control.env_steps={steps or SAC_TASKS[task]['steps']}",
            f"control.eval_episodes={SAC_EVAL_EPISODES}",
            *SAC_TASKS[task]["hone"],
            "logging.progress=false",
            "logging.tensorboard=false",
            "logging.plot=[]",
        ]
        cfg = load_config(SAC_TASKS[task]["recipe"], overrides)
        cpu = time.process_time()
        result = train_control(cfg)  # with an eval before and after training (2 x 10 episodes)
        cpu = time.process_time() - cpu
    return {"env_steps": result.env_steps, "cpu_s": cpu, "eval_return": result.final_eval["eval/return"]}


def run_sb3_sac(seed: int, task: str = "pendulum", steps: int | None = None) -> dict[str, float]:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    from hone.control.evaluate import EVAL_SEED

    torch.set_num_threads(1)
    cpu = time.process_time()
    env = gym.make(SAC_TASKS[task]["env"])
    if SAC_TASKS[task].get("algo") == "td3":
        noise = NormalActionNoise(np.zeros(env.action_space.shape), 0.1 * np.ones(env.action_space.shape))
        extra: dict = {"action_noise": noise}
        algo = TD3
    else:
        extra, algo = {}, SAC
    model = algo(
        "MlpPolicy",
        env,
        buffer_size=1_000_000,
        batch_size=256,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        seed=seed,
        device="cpu",
        **SAC_TASKS[task]["sb3"],
        **extra,
    )
    model.learn(total_timesteps=steps or SAC_TASKS[task]["steps"])
    env, returns = gym.make(SAC_TASKS[task]["env"]), []
    for i in range(SAC_EVAL_EPISODES):  # the deterministic policy on Hone's eval seeds
        obs, _ = env.reset(seed=EVAL_SEED + i)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), bool(terminated or truncated)
        returns.append(total)
    cpu = time.process_time() - cpu
    return {"env_steps": model.num_timesteps, "cpu_s": cpu, "eval_return": float(np.mean(returns))}


def sac_bench(seeds: list[int], task: str, steps: int | None = None) -> None:
    rows: dict[str, list[dict[str, float]]] = {"hone": [], "sb3": []}
    for seed in seeds:
        for impl in ("hone", "sb3"):
            row = _subprocess(f"{impl}-sac", seed, task, steps)
            rows[impl].append(row)
            target = None if steps else SAC_TASKS[task]["target"]
            reached = "" if target is None else "reached" if row["eval_return"] >= target else "NOT reached"
            bar = f" ({reached} {target:.0f})" if target is not None else ""
            print(
                f"{impl:5s} seed {seed}: eval return {row['eval_return']:8.1f} at {row['env_steps']:,} env "
                f"steps{bar}, {row['cpu_s']:6.1f} CPU-s, "
                f"{1000 * row['cpu_s'] / row['env_steps']:.2f} CPU-ms per env step",
                flush=True,
            )
    per_step = {
        impl: sum(r["cpu_s"] for r in runs) / sum(r["env_steps"] for r in runs) for impl, runs in rows.items()
    }
    print(
        f"\nCPU-ms per env step: Hone {1000 * per_step['hone']:.2f}, SB3 {1000 * per_step['sb3']:.2f}, ratio "
        f"{per_step['hone'] / per_step['sb3']:.2f}x"
    )


def _subprocess(which: str, seed: int, task: str = "pendulum", steps: int | None = None) -> dict[str, float]:
    extra = ["--steps", str(steps)] if steps else []
    out = subprocess.run(
        [sys.executable, __file__, "--one", which, "--seed", str(seed), "--task", task, *extra],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


ONE = {"hone": run_hone, "sb3": run_sb3, "hone-sac": run_hone_sac, "sb3-sac": run_sb3_sac}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 (PPO), 0 (SAC)")
    parser.add_argument("--pendulum-sac", action="store_true", help="SAC on Pendulum-v1 instead of PPO")
    parser.add_argument("--halfcheetah-sac", action="store_true", help="SAC on HalfCheetah-v5, 100k steps")
    parser.add_argument("--hopper-td3", action="store_true", help="TD3 on Hopper-v5, 50k steps")
    parser.add_argument("--quick", action="store_true", help="CI-sized: PPO seed 0, SAC 2k steps, no targets")
    parser.add_argument("--task", choices=sorted(SAC_TASKS), default="pendulum", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--one", choices=sorted(ONE), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run = ONE[args.one]
        sac = args.one.endswith("-sac")
        print(json.dumps(run(args.seed, args.task, args.steps) if sac else run(args.seed)))
        return
    if args.pendulum_sac or args.halfcheetah_sac or args.hopper_td3:
        task = "halfcheetah" if args.halfcheetah_sac else "hopper-td3" if args.hopper_td3 else "pendulum"
        sac_bench(args.seeds or [0], task)
        return
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    rows: dict[str, list[dict[str, float]]] = {"hone": [], "sb3": []}
    for seed in args.seeds:
        for impl in ("hone", "sb3"):
            row = _subprocess(impl, seed)
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
    print(
        f"CPU-seconds, summed over seeds: Hone {cpu['hone']:.1f}, SB3 {cpu['sb3']:.1f}, ratio "
        f"{cpu['hone'] / cpu['sb3']:.2f}x (target <= 1.0x)"
    )
    steps = {impl: sum(r["env_steps"] for r in runs) for impl, runs in rows.items()}
    per_k = {impl: 1000 * cpu[impl] / steps[impl] for impl in rows}
    print(
        f"where it goes: env steps to 475, Hone {steps['hone']:,} vs SB3 {steps['sb3']:,} "
        f"({steps['hone'] / steps['sb3']:.2f}x); CPU-s per 1k env steps, Hone {per_k['hone']:.3f} vs SB3 "
        f"{per_k['sb3']:.3f} ({per_k['hone'] / per_k['sb3']:.2f}x)"
    )
    if args.quick:
        print("\nSAC, Pendulum-v1, 2k steps (no target):")
        sac_bench([0], "pendulum", steps=2_000)


if __name__ == "__main__":
    main()

"""Control throughput per environment backend: gymnasium sync, gymnasium async, envpool.

Two numbers per backend, each through Hone's own `make_vector_env` (SAME_STEP autoreset and episode
statistics included, as a run uses it):
- env steps/s: random actions (pre-sampled), no policy: what the backend itself costs;
- for envpool also its own API bare (NEXT_STEP, no statistics), the cost of the adapter on top;
- PPO steps/s: Hone's whole PPO loop (collect with the policy, GAE, the update epochs), environment steps
  per second of training, from the run's own `env/steps_per_s` (env creation and evals excluded).
Cases: CartPole-v1 with 8 envs (recipes/cartpole-ppo.yaml: 8 x 32 steps, 20 epochs of one batch of 256)
and, with MuJoCo installed, HalfCheetah-v5 with 4 envs (recipes/halfcheetah-ppo.yaml's update, 4 x 512
steps per RL step). With stable-baselines3 installed, SB3 2.9's PPO runs the CartPole setting too
(DummyVecEnv, its sync backend), as the peer of Hone's sync row. Backends alternate round by round and each
cell is the median of `--rounds`, so a load change on a shared machine hits all of them.

    .venv/bin/python bench/control_throughput.py                # ~3 minutes on a quiet 2-core machine
    .venv/bin/python bench/control_throughput.py --rounds 1 --seconds 0.2 --quick   # a smoke test
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

BACKENDS = ("sync", "async", "envpool")
QUIET = ["logging.progress=false", "logging.tensorboard=false", "logging.plot=[]", "run.threads=1"]
# (recipe, env, num_envs, overrides of the PPO row, env steps of the PPO row)
CASES = [
    ("cartpole-ppo", "CartPole-v1", 8, [], 8192),
    (
        "halfcheetah-ppo",
        "HalfCheetah-v5",
        4,
        ["control.rollout_steps=512", "control.ppo.mini_batches=32"],
        4096,
    ),
]


def env_rate(recipe: str, env: str, n: int, backend: str, seconds: float) -> float:
    """Environment steps per wall second with random actions (after 20 warm-up steps)."""
    from hone.config import load_config
    from hone.control.envs import make_vector_env

    cfg = load_config(
        recipe, [f"control.env={env}", f"control.num_envs={n}", f"control.vectorization={backend}"]
    )
    assert cfg.control is not None
    envs = make_vector_env(cfg.control, seed=0)
    try:
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(64)]
        envs.reset(seed=0)
        for i in range(20):
            envs.step(actions[i % 64])
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            for i in range(64):
                envs.step(actions[i])
            steps += 64 * n
        return steps / (time.perf_counter() - started)
    finally:
        envs.close()


def raw_envpool_rate(env: str, n: int, seconds: float) -> float:
    """envpool's own gymnasium API with random actions, no adapter and no episode statistics: what the
    SAME_STEP adapter and RecordEpisodeStatistics cost on top (its NEXT_STEP resets are not training data)."""
    import warnings

    import envpool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pool = envpool.make(env, env_type="gymnasium", num_envs=n, seed=0, num_threads=1)
        pool.action_space.seed(0)
        actions = [np.stack([pool.action_space.sample() for _ in range(n)]) for _ in range(64)]
    try:
        pool.reset()
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            for i in range(64):
                pool.step(actions[i])
            steps += 64 * n
        return steps / (time.perf_counter() - started)
    finally:
        pool.close()


def ppo_rate(recipe: str, env: str, n: int, backend: str, extra: list[str], env_steps: int) -> float:
    """Environment steps per second of Hone's PPO loop (collect + GAE + update)."""
    from hone.config import load_config
    from hone.control.loops import train_control
    from hone.tracking import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"run.dir={tmp}",
            "run.eval_every=0",
            f"control.env={env}",
            f"control.num_envs={n}",
            f"control.vectorization={backend}",
            f"control.env_steps={env_steps}",
            "control.eval_episodes=1",
            *extra,
            *QUIET,
        ]
        result = train_control(load_config(recipe, overrides))
        return float(read_metrics(result.run_dir / "metrics.jsonl")[-1]["env/steps_per_s"])


def sb3_cartpole_rate(env_steps: int) -> float:
    """SB3 2.9 PPO with cartpole-ppo's setting: environment steps per wall second of `learn`."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    model = PPO(
        "MlpPolicy",
        make_vec_env("CartPole-v1", n_envs=8, seed=0),
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        learning_rate=lambda remaining: remaining * 1e-3,
        clip_range=lambda remaining: remaining * 0.2,
        ent_coef=0.0,
        max_grad_norm=0.5,
        seed=0,
        device="cpu",
    )
    started = time.perf_counter()
    model.learn(total_timesteps=env_steps)
    return model.num_timesteps / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="per env-steps/s measurement")
    parser.add_argument("--quick", action="store_true", help="PPO rows of 1 RL step (a smoke test)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "control_throughput.json"
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    backends = [b for b in BACKENDS if b != "envpool" or importlib.util.find_spec("envpool")]
    cases = [c for c in CASES if c[1] != "HalfCheetah-v5" or importlib.util.find_spec("mujoco")]
    sb3 = importlib.util.find_spec("stable_baselines3") is not None
    samples: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for recipe, env, n, extra, ppo_steps in cases:
            for backend in backends:
                samples.setdefault(f"{env}|{backend}|env", []).append(
                    env_rate(recipe, env, n, backend, args.seconds)
                )
                steps = n * (32 if env == "CartPole-v1" else 512) if args.quick else ppo_steps
                samples.setdefault(f"{env}|{backend}|ppo", []).append(
                    ppo_rate(recipe, env, n, backend, extra, steps)
                )
            if "envpool" in backends:
                samples.setdefault(f"{env}|envpool-raw|env", []).append(
                    raw_envpool_rate(env, n, args.seconds)
                )
            if sb3 and env == "CartPole-v1":
                samples.setdefault(f"{env}|sb3|ppo", []).append(sb3_cartpole_rate(ppo_steps))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    median = {key: statistics.median(values) for key, values in samples.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"median": median, "samples": samples}, indent=2) + "\n")
    print("\n| env (num_envs) | backend | env steps/s (random actions) | PPO env steps/s (whole loop) |")
    print("|---|---|---|---|")
    for _recipe, env, n, _extra, _steps in cases:
        base = median[f"{env}|sync|env"]
        for backend in backends:
            rate, ppo = median[f"{env}|{backend}|env"], median[f"{env}|{backend}|ppo"]
            print(f"| {env} ({n}) | {backend} | {rate:,.0f} ({rate / base:.2f}x) | {ppo:,.0f} |")
        if f"{env}|envpool-raw|env" in median:
            raw = median[f"{env}|envpool-raw|env"]
            print(
                f"| {env} ({n}) | envpool bare (NEXT_STEP, no stats) | {raw:,.0f} ({raw / base:.2f}x) | - |"
            )
        if f"{env}|sb3|ppo" in median:
            print(f"| {env} ({n}) | SB3 2.9 PPO (DummyVecEnv) | - | {median[f'{env}|sb3|ppo']:,.0f} |")


if __name__ == "__main__":
    main()

"""MAPPO and IPPO on mpe2's simple_spread_v3 against a uniformly random team, measured in one run.

The setting is the recipe `simple-spread-mappo` (3 agents, max_cycles 25, local_ratio 0.5, discrete
actions; JaxMARL's IPPO MPE hyperparameters with the budget scaled to a CPU), seed 0. MAPPO is the recipe
as is (`control.ppo.multi_agent_critic: centralized`: the critic reads the joint observation and the agent's
index); IPPO the same with `independent` (each agent's critic reads its own observation). Both share one
actor and one critic across the agents.

The number compared is the team return: the sum over the 3 agents of an episode's rewards (25 steps). The
random team plays `--episodes` episodes on the eval seeds; each trained team's final policy is played
deterministically (argmax) on the same seeds (`hone eval` of the run). The curve is `eval/return` during
training (`control.eval_episodes` episodes per point) against environment steps, with the random line.

Target (issue 32): a trained team at least 25% better than the random team. Returns are negative, so
trained >= 0.75 × random.

    nice -n 5 .venv/bin/python bench/marl_bench.py            # ~10 CPU-minutes per team
    nice -n 5 .venv/bin/python bench/marl_bench.py --quick    # CI-sized: tiny budget, no target
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

IMPROVEMENT = 0.25  # the target: at least 25% better than the random team
TEAMS = {"MAPPO": "centralized", "IPPO": "independent"}
CURVE = Path(__file__).parents[1] / "docs" / "images" / "simple-spread-marl.png"


def _overrides(run_dir: str, args: argparse.Namespace) -> list[str]:
    out = [
        f"run.dir={run_dir}",
        f"run.seed={args.seed}",
        "run.threads=1",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.plot=[]",
    ]
    if args.quick:
        out += ["control.env_steps=8192", "run.eval_every=1", "control.eval_episodes=5"]
    elif args.env_steps:
        out.append(f"control.env_steps={args.env_steps}")
    return out


def random_team(episodes: int) -> float:
    from hone.config import load_config
    from hone.control.multiagent import evaluate_team as evaluate

    cfg = load_config("simple-spread-mappo", [f"control.eval_episodes={episodes}"])
    assert cfg.control is not None
    return evaluate(None, cfg.control)["eval/return"]


def train(team: str, run_dir: str, args: argparse.Namespace) -> dict[str, object]:
    """One run of the recipe with `team`'s critic: CPU-seconds, the eval curve, and the final policy's team
    return on `args.episodes` eval episodes (the random team's seeds)."""
    from hone.config import load_config
    from hone.control.loops import evaluate_saved, train_control
    from hone.tracking import read_metrics

    overrides = [
        *_overrides(run_dir, args),
        f"run.name={team}",
        f"control.ppo.multi_agent_critic={TEAMS[team]}",
    ]
    cfg = load_config("simple-spread-mappo", overrides)
    cpu, wall = time.process_time(), time.perf_counter()
    result = train_control(cfg)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    curve = [(row.get("env/steps", 0.0), row["eval/return"]) for row in rows if "eval/return" in row]
    final = load_config(
        result.run_dir / "config.yaml",
        [f"model.path={result.run_dir / 'model'}", f"control.eval_episodes={args.episodes}"],
    )
    return {
        "env_steps": result.env_steps,
        "cpu_s": cpu,
        "wall_s": wall,
        "train_return100": rows[-1].get("episode/return"),
        "final_return": evaluate_saved(final)["eval/return"],
        "curve": curve,
    }


def plot(results: dict[str, dict[str, object]], random: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2), dpi=90)
    for team, result in results.items():
        steps, returns = zip(*result["curve"], strict=True)  # type: ignore[call-overload]
        ax.plot(steps, returns, label=f"{team} (deterministic eval)")
    ax.axhline(random, color="grey", linestyle="--", label="random team")
    ax.axhline((1 - IMPROVEMENT) * random, color="grey", linestyle=":", label="target (25% better)")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("team return")
    ax.set_title("simple_spread_v3 (3 agents), seed 0", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="CI-sized: 8k env steps per team, no target")
    parser.add_argument("--env-steps", type=int, help="override the recipe's control.env_steps")
    parser.add_argument("--episodes", type=int, default=200, help="random-team and final-eval episodes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plot", help=f"the curve PNG (default: {CURVE.relative_to(CURVE.parents[2])}; none with --quick)"
    )
    args = parser.parse_args()
    if args.quick:
        args.episodes = min(args.episodes, 20)
    plot_path = Path(args.plot) if args.plot else None if args.quick else CURVE
    cpu = time.process_time()
    random = random_team(args.episodes)
    print(
        f"random team: {random:.1f} mean team return over {args.episodes} episodes "
        f"({time.process_time() - cpu:.0f} CPU-s)",
        flush=True,
    )
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for team in TEAMS:
            results[team] = result = train(team, tmp, args)
            print(
                f"{team:5s}: final {result['final_return']:.1f} (deterministic, {args.episodes} episodes), "
                f"training rolling-100 {result['train_return100']:.1f}, {result['env_steps']:,} env steps, "
                f"{result['cpu_s']:.0f} CPU-s, {result['wall_s']:.0f} wall-s",
                flush=True,
            )
    bar = (1 - IMPROVEMENT) * random
    print(f"\n| team | final team return | vs random ({random:.1f}) | >= {bar:.1f} | env steps | CPU-s |")
    print("|---|---|---|---|---|---|")
    for team, r in results.items():
        final = float(r["final_return"])  # type: ignore[arg-type]
        better = (final - random) / abs(random)
        verdict = "(quick: no target)" if args.quick else "met" if final >= bar else "NOT met"
        print(f"| {team} | {final:.1f} | {better:+.0%} | {verdict} | {r['env_steps']:,} | {r['cpu_s']:.0f} |")
    if plot_path is not None:
        plot(results, random, plot_path)
        print(f"\ncurve: {plot_path} ({plot_path.stat().st_size // 1024} KB)")
    summary = {
        "random": random,
        **{t: {k: v for k, v in r.items() if k != "curve"} for t, r in results.items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""Multi-turn credit assignment at equal wall time (issue 37): GRPO over whole episodes, `turn_grpo` (one
trajectory baseline for every turn), `turn_grpo` with the turn-index baseline, and GiGPO's anchor-state
step groups, on `agent-guess` and `agent-retry`, two seeds.

For each recipe and seed the recipe's own SFT warm start is made once (`hone sft <recipe>`, its stop rule);
every arm then runs RL from it for the same wall time (`--seconds`), two arms side by side with one
torch thread each (so every arm shares the machine the same way). Each arm is the recipe with only
`algorithm.advantage` (and its options) changed. Reported per arm: greedy held-out success at the start
and the end (and its best eval), the eval top-answer share at the start and end, RL steps, and the
sampled entropy by turn (`entropy/turn_<k>`) over the first and last tenth of the steps; the curves go to
`docs/images/agent-credit-entropy.png`.

    .venv/bin/python bench/agent_credit.py                       # everything (~1 hour at --seconds 300)
    .venv/bin/python bench/agent_credit.py --recipes agent-guess --seeds 0 --arms grpo gigpo
    .venv/bin/python bench/agent_credit.py --report              # reprint bench/results/agent_credit.json

Writes bench/results/agent_credit.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from side_by_side import run_side_by_side

RESULTS = Path(__file__).parent / "results" / "agent_credit.json"
FIGURE = Path(__file__).parent.parent / "docs" / "images" / "agent-credit-entropy.png"
# Each arm changes only the estimator; the turn arms' discount is the recipe's `algorithm.gamma`, or 0.9
# where the recipe has none (with only an outcome reward and gamma 1, `turn_grpo` is GRPO exactly;
# GiGPO's paper uses 0.95).
ARMS: dict[str, list[str]] = {
    "grpo": ["algorithm.advantage=grpo"],
    "turn_grpo": ["algorithm.advantage=turn_grpo", "algorithm.turn_baseline=trajectory"],
    "turn_index": ["algorithm.advantage=turn_grpo", "algorithm.turn_baseline=turn_index"],
    "gigpo": ["algorithm.advantage=gigpo"],
}
RECIPES = ("agent-guess", "agent-retry")


def hone(*args: str) -> list[str]:
    return [sys.executable, "-m", "hone.cli", *args]


def warm_start(args: argparse.Namespace, recipe: str, seed: int) -> Path:
    """The recipe's SFT result: `--start RECIPE:SEED=DIR` or `RECIPE=DIR` (every seed's) when given, else
    made once per seed (2 threads, alone)."""
    given = dict(item.split("=", 1) for item in args.start)
    for key in (f"{recipe}:{seed}", recipe):
        if key in given and (Path(given[key]) / "config.json").is_file():
            return Path(given[key])
    name = f"{recipe}-sft-s{0 if recipe in given else seed}"  # `RECIPE=DIR` not made yet: seed 0's, once
    model = Path(args.runs) / name / "sft"
    if not (model / "config.json").is_file():
        subprocess.run(
            hone(
                "sft",
                recipe,
                f"run.dir={args.runs}",
                f"run.name={name}",
                f"run.seed={seed}",
                "run.time_limit_s=null",
            ),
            check=True,
        )
    return model


def arm_name(recipe: str, seed: int, arm: str) -> str:
    return f"{recipe}-s{seed}-{arm}"


def arm_command(args: argparse.Namespace, recipe: str, seed: int, arm: str, start: Path) -> list[str]:
    return hone(
        "train", recipe, f"run.dir={args.runs}", f"run.name={arm_name(recipe, seed, arm)}",
        f"run.seed={seed}",
        "run.threads=1", "run.steps=100000", f"run.time_limit_s={args.seconds}", "run.save_every=0",
        f"model.path={start}", "sft.enabled=false", "logging.progress=false", "logging.tensorboard=false",
        *ARMS[arm], *discount(recipe, arm),
    )  # fmt: skip


def discount(recipe: str, arm: str) -> list[str]:
    """`algorithm.gamma=0.9` for a turn arm of a recipe that leaves gamma at 1."""
    from hone.config import load_config

    if arm == "grpo" or load_config(recipe, []).algorithm.gamma != 1.0:
        return []
    return ["algorithm.gamma=0.9"]


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [
        (r["step"], r["eval/accuracy"], r.get("eval/top_answer_share")) for r in rows if "eval/accuracy" in r
    ]
    steps = [r for r in rows if "loss/policy" in r or "time/step_s" in r]
    tenth = max(1, len(steps) // 10)

    def entropy(part: list[dict[str, Any]]) -> dict[str, float]:
        keys = sorted(
            {k for r in part for k in r if k.startswith("entropy/turn_")}, key=lambda k: int(k.split("_")[-1])
        )
        return {k[len("entropy/") :]: round(statistics.fmean(r[k] for r in part if k in r), 3) for k in keys}

    def solved(part: list[dict[str, Any]]) -> float:  # sampled success: the game's own count when it has one
        return round(statistics.fmean(r.get("env/solved", r.get("reward/mean", 0.0)) for r in part), 3)

    return {
        "steps": max((r["step"] for r in steps), default=0),
        "sampled_first_tenth": solved(steps[:tenth]),
        "sampled_last_tenth": solved(steps[-tenth:]),
        "eval_start": evals[0][1],
        "eval_end": evals[-1][1],
        "eval_best": max(e[1] for e in evals),
        "top_share_start": evals[0][2],
        "top_share_end": evals[-1][2],
        "entropy_first_tenth": entropy(steps[:tenth]),
        "entropy_last_tenth": entropy(steps[-tenth:]),
        "curve": [[r["step"], r.get("entropy/turn_1"), r.get("entropy/turn_3")] for r in steps],
        "evals": [[s, a] for s, a, _ in evals],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    for recipe in args.recipes:
        for seed in args.seeds:
            start = warm_start(args, recipe, seed)
            arms = list(args.arms)
            for pair in (arms[i : i + 2] for i in range(0, len(arms), 2)):
                commands = {
                    arm_name(recipe, seed, a): arm_command(args, recipe, seed, a, start) for a in pair
                }
                run_side_by_side(commands, Path(args.runs) / "logs", args.seconds + 600)
                for arm in pair:
                    rows = load(Path(args.runs) / arm_name(recipe, seed, arm) / "metrics.jsonl")
                    results.setdefault(recipe, {}).setdefault(arm, {})[str(seed)] = summarise(rows)
                RESULTS.write_text(json.dumps(results, indent=1))
    return results


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """The results of the arms already run under `--runs`, summarised again (no training)."""
    results: dict[str, Any] = {}
    for recipe in args.recipes:
        for seed in args.seeds:
            for arm in args.arms:
                path = Path(args.runs) / arm_name(recipe, seed, arm) / "metrics.jsonl"
                if path.is_file():
                    results.setdefault(recipe, {}).setdefault(arm, {})[str(seed)] = summarise(load(path))
    RESULTS.write_text(json.dumps(results, indent=1))
    return results


def report(results: dict[str, Any]) -> None:
    print(
        "| recipe | arm | seed | RL steps | held-out start → end (best) | sampled success, first → last "
        "tenth "
        "| top share start → end | entropy turn 1 / 3, first → last tenth |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for recipe, arms in results.items():
        for arm, seeds in arms.items():
            for seed, s in sorted(seeds.items()):
                first, last = s["entropy_first_tenth"], s["entropy_last_tenth"]
                before, after = (
                    f"{first.get('turn_1')} / {first.get('turn_3')}",
                    f"{last.get('turn_1')} / {last.get('turn_3')}",
                )
                ent = f"{before} → {after}"
                print(
                    f"| {recipe} | {arm} | {seed} | {s['steps']} | {100 * s['eval_start']:.1f}% → "
                    f"{100 * s['eval_end']:.1f}% ({100 * s['eval_best']:.1f}%) | "
                    f"{s['sampled_first_tenth']} → {s['sampled_last_tenth']} | {s['top_share_start']} → "
                    f"{s['top_share_end']} | {ent} |"
                )


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = list(results)
    fig, axes = plt.subplots(2, len(recipes), figsize=(6 * len(recipes), 7), squeeze=False)
    for col, recipe in enumerate(recipes):
        for arm, seeds in results[recipe].items():
            for seed, s in sorted(seeds.items()):
                style = "-" if seed == "0" else "--"
                steps = [c[0] for c in s["curve"] if c[1] is not None]
                axes[0][col].plot(
                    steps, [c[1] for c in s["curve"] if c[1] is not None], style, label=f"{arm} s{seed}"
                )
                third = [(c[0], c[2]) for c in s["curve"] if c[2] is not None]
                axes[1][col].plot([t[0] for t in third], [t[1] for t in third], style, label=f"{arm} s{seed}")
        axes[0][col].set_title(f"{recipe}: entropy of turn 1 (nats/token)")
        axes[1][col].set_title(f"{recipe}: entropy of turn 3")
        for row in axes:
            row[col].set_xlabel("RL step")
        axes[0][col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--seconds", type=int, default=300, help="wall time of each arm's RL")
    parser.add_argument("--runs", default="runs/agent-credit")
    parser.add_argument(
        "--start",
        nargs="*",
        default=[],
        help="RECIPE[:SEED]=DIR: an existing SFT result to start that recipe's (seed's) arms from",
    )
    parser.add_argument("--report", action="store_true", help="reprint the saved results")
    parser.add_argument("--collect", action="store_true", help="re-summarise the arms already in --runs")
    args = parser.parse_args()
    if args.report:
        results = json.loads(RESULTS.read_text())
    elif args.collect:
        results = collect(args)
    else:
        results = run(args)
    report(results)
    if not args.report:
        plot(results)


if __name__ == "__main__":
    main()

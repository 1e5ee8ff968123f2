"""Which prompts to train on: uniform sampling vs DAPO's dynamic sampling with refill vs the difficulty
curriculum, at the same wall-time budget, on a reasoning-gym task (issue 20's proof).

Every arm starts from the same warm-started model (`--start`, e.g. the SFT of `gym-chain_sum`, made once
with `hone sft recipes/gym-chain_sum.yaml run.name=gym-sft run.time_limit_s=null`), so the arms differ
only in which prompts and groups the learner sees:

- `uniform`: the recipe as it is (seeded epoch shuffle; groups whose rewards are all equal dropped, no
  refill),
- `refill`: `algorithm.dynamic_sampling.enabled=true` (DAPO §3.2: resample until every update has
  `prompts_per_step` groups with a signal),
- `difficulty`: `data.scheduler=difficulty` (PCL/PACED-RL: prompts whose tracked pass rate is nearest a
  target that falls as the policy improves).

For each seed the arms run at the same time, one torch thread each (`run.threads=1`), so they share the
machine's cores evenly and see the same contention; each stops at `--budget` seconds of RL
(`run.time_limit_s`; there is no SFT inside it). Reported: held-out accuracy (the recipe's eval set)
before RL, at each quarter of the budget (the last eval at or before it) and at the end; the share of
the step's first-round groups with no reward variance (`groups/skipped_frac`: what uniform sampling
drops and refill resamples) per quarter; steps and seconds a step. Wall time is the sum of the steps'
`time/step_s` (evals and checkpoints excluded: they cost every arm alike per eval).

    .venv/bin/python bench/curriculum_bench.py --start runs/gym-sft/sft            # 2 seeds x 600 s
    .venv/bin/python bench/curriculum_bench.py --report                             # reprint the table

Writes bench/results/curriculum_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from metrics_log import read_metrics, rl_clock
from side_by_side import run_side_by_side

RESULTS = Path(__file__).parent / "results" / "curriculum_bench.json"
ARMS: dict[str, list[str]] = {
    "uniform": [],
    "refill": ["algorithm.dynamic_sampling.enabled=true"],
    "difficulty": ["data.scheduler=difficulty"],
}
QUARTERS = (0.25, 0.5, 0.75, 1.0)


def run_seed(args: argparse.Namespace, seed: int) -> None:
    """Every arm of one seed at once, each stopped at its budget (the deadline: budget + `--grace-s`)."""
    commands = {run_name(arm, seed): arm_command(args, arm, seed) for arm in args.arms}
    run_side_by_side(commands, Path(args.runs) / "logs", args.budget + args.grace_s)


def arm_command(args: argparse.Namespace, arm: str, seed: int) -> list[str]:
    cmd = [
        sys.executable, "-m", "hone.cli", "train", args.recipe,
        f"run.dir={args.runs}", f"run.name={run_name(arm, seed)}", f"run.seed={seed}", "run.threads=1",
        f"run.time_limit_s={args.budget}", f"run.eval_every={args.eval_every}",
        "run.save_every=100000", f"model.path={args.start}", "sft.enabled=false",
        *ARMS[arm], *args.override,
    ]  # fmt: skip
    return cmd


def run_name(arm: str, seed: int) -> str:
    return f"cb-{arm}-s{seed}"


def summarise(metrics_path: Path) -> dict[str, Any]:
    """Accuracy at quarters of the RL wall time, the zero-signal share per quarter, steps, s/step."""
    rows = read_metrics(metrics_path)
    at_step, clock = rl_clock(rows)
    evals = [(at_step.get(r["step"], clock), r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "time/step_s" in r]
    total = clock
    accuracy, zero_signal = [], []
    for q in QUARTERS:
        upto = [acc for t, acc in evals if t <= q * total + 1e-9]
        accuracy.append(upto[-1] if upto else None)
        lo, hi = (q - 0.25) * total, q * total
        frac = [r["groups/skipped_frac"] for r in steps
                if "groups/skipped_frac" in r and lo < at_step[r["step"]] <= hi + 1e-9]  # fmt: skip
        zero_signal.append(statistics.fmean(frac) if frac else None)
    return {
        "steps": len(steps),
        "rl_s": round(total, 1),
        "s_per_step": round(total / max(1, len(steps)), 3),
        "before": evals[0][1] if evals else None,
        "accuracy": accuracy,
        "final": evals[-1][1] if evals else None,
        "zero_signal": zero_signal,
        "rounds_per_step": statistics.fmean(r.get("groups/attempts", 1.0) for r in steps) if steps else None,
    }


def table(results: dict[str, Any]) -> str:
    pct = lambda x: "—" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    lines = [
        "| seed | arm | RL steps | s/step | rounds/step | accuracy before → ¼ → ½ → ¾ → end | "
        "zero-signal groups by quarter |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed, arms in results["runs"].items():
        for arm, s in arms.items():
            acc = " → ".join(pct(a) for a in [s["before"], *s["accuracy"]])
            zero = " ".join(pct(z) for z in s["zero_signal"])
            lines.append(f"| {seed} | {arm} | {s['steps']} | {s['s_per_step']} | "
                         f"{s['rounds_per_step']:.2f} | {acc} | {zero} |")  # fmt: skip
    lines.append("")
    lines.append("| arm | final accuracy, mean of seeds | gain over before | per seed |")
    lines.append("|---|---|---|---|")
    arms = list(next(iter(results["runs"].values())))
    for arm in arms:
        finals = [results["runs"][seed][arm]["final"] for seed in results["runs"]]
        gains = [results["runs"][seed][arm]["final"] - results["runs"][seed][arm]["before"]
                 for seed in results["runs"]]  # fmt: skip
        lines.append(f"| {arm} | {pct(statistics.fmean(finals))} | {100 * statistics.fmean(gains):+.1f} | "
                     f"{', '.join(pct(f) for f in finals)} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--start", help="the warm-started model every arm begins from (HF directory)")
    parser.add_argument("--recipe", default="recipes/gym-chain_sum.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--budget", type=float, default=600.0, help="RL seconds per arm")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--grace-s", type=float, default=600.0, help="past the budget before giving up")
    parser.add_argument("--runs", default="runs/curriculum_bench")
    parser.add_argument("--override", nargs="*", default=[], help="extra key=value for every arm")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON written (and --report read)")
    parser.add_argument("--report", action="store_true", help="reprint the saved results")
    args = parser.parse_args()
    if args.report:
        print(table(json.loads(args.results.read_text())))
        return
    if not args.start:
        parser.error("--start is required (the warm-started model every arm begins from)")
    for seed in args.seeds:
        print(f"seed {seed}: {', '.join(args.arms)} side by side, {args.budget:.0f} s each", flush=True)
        run_seed(args, seed)
    results = {
        "recipe": args.recipe, "start": args.start, "budget_s": args.budget, "cores": os.cpu_count(),
        "override": args.override,
        "runs": {str(seed): {arm: summarise(Path(args.runs) / run_name(arm, seed) / "metrics.jsonl")
                             for arm in args.arms} for seed in args.seeds},
    }  # fmt: skip
    args.results.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()

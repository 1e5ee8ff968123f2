"""The same game through Hone's environment adapters: `agent-guess` (the built-in `GuessNumber`) against
`agent-guess-openenv` (the game as an OpenEnv server, `env.name: openenv`) and `agent-guess-verifiers`
(the game as a verifiers environment, `env.name: verifiers:<module>`), issue 21's proof.

Every arm starts RL from the same warm start (`--start`, made once with
`hone sft agent-guess run.name=guess-sft run.time_limit_s=null`) with the same seed and runs a fixed
number of steps (`--steps`): the adapters cost different wall time per step (a server round trip, a
verifiers trace), so equal wall time would compare step counts, not learning. The arms run side by side,
one torch thread each. Reported: sampled success (`reward/mean`) averaged per quarter of the steps, greedy
held-out success (`eval/accuracy`) at the start and end, seconds a step, `env/errors`, and how many logged
values (time keys aside) differ from the built-in arm's at the same step.

    .venv/bin/python bench/adapters_bench.py --start runs/guess-sft/sft --steps 120
    .venv/bin/python bench/adapters_bench.py --report

Writes bench/results/adapters_bench.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from side_by_side import run_side_by_side

RESULTS = Path(__file__).parent / "results" / "adapters_bench.json"
ARMS = {"builtin": "agent-guess", "openenv": "agent-guess-openenv", "verifiers": "agent-guess-verifiers"}
TIME_KEYS = ("time/", "throughput/")


def run_arms(args: argparse.Namespace) -> None:
    """Every arm at once, the same fixed number of steps from the same start."""
    run_side_by_side(
        {arm: arm_command(args, arm) for arm in args.arms}, Path(args.runs) / "logs", args.timeout_s
    )


def arm_command(args: argparse.Namespace, arm: str) -> list[str]:
    cmd = [
        sys.executable, "-m", "hone.cli", "train", ARMS[arm],
        f"run.dir={args.runs}", f"run.name={arm}", f"run.seed={args.seed}", "run.threads=1",
        f"run.steps={args.steps}", "run.time_limit_s=null", "run.save_every=100000",
        f"model.path={args.start}", "sft.enabled=false",
    ]  # fmt: skip
    if arm == "builtin":  # the ports pay no per-turn shaping: compare like with like
        cmd.append("env.args.shaping=0.0")
    return cmd


def load(path: Path) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)  # eval rows share the step of a train row
    return rows


def summarise(rows: dict[int, dict[str, Any]], builtin: dict[int, dict[str, Any]]) -> dict[str, Any]:
    steps = sorted(s for s, r in rows.items() if "time/step_s" in r)
    quarters = [steps[i * len(steps) // 4 : (i + 1) * len(steps) // 4] for i in range(4)]
    evals = [rows[s]["eval/accuracy"] for s in sorted(rows) if "eval/accuracy" in rows[s]]
    # Over the values both arms log (an adapter may log more, e.g. verifiers' reward/<name> parts).
    shared = [
        (value, builtin[s][key])
        for s, row in rows.items()
        for key, value in row.items()
        if not key.startswith(TIME_KEYS) and key in builtin.get(s, {})
    ]
    return {
        "steps": len(steps),
        "s_per_step": round(statistics.fmean(rows[s]["time/step_s"] for s in steps), 3),
        "reward_by_quarter": [
            round(statistics.fmean(rows[s]["reward/mean"] for s in q), 4) for q in quarters
        ],
        "eval_start": evals[0],
        "eval_end": evals[-1],
        "env_errors": sum(rows[s].get("env/errors", 0.0) for s in steps),
        "values_compared": len(shared),
        "values_differing_from_builtin": sum(a != b for a, b in shared),
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        "| arm | steps | s/step | sampled success by quarter of the steps | greedy held-out start → end | "
        "env/errors | values ≠ built-in |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, s in results["arms"].items():
        quarters = " ".join(f"{100 * q:.1f}%" for q in s["reward_by_quarter"])
        lines.append(
            f"| {arm} | {s['steps']} | {s['s_per_step']} | {quarters} | {100 * s['eval_start']:.1f}% → "
            f"{100 * s['eval_end']:.1f}% | {s['env_errors']:.0f} | "
            f"{s['values_differing_from_builtin']} of {s['values_compared']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--start", help="the warm-started model every arm begins from (HF directory)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--runs", default="runs/adapters_bench")
    parser.add_argument("--report", action="store_true", help="reprint the saved results")
    args = parser.parse_args()
    if args.report:
        print(table(json.loads(RESULTS.read_text())))
        return
    if not args.start:
        parser.error("--start is required (the warm-started model every arm begins from)")
    if "builtin" not in args.arms:
        parser.error("the builtin arm is the reference; keep it in --arms")
    run_arms(args)
    rows = {arm: load(Path(args.runs) / arm / "metrics.jsonl") for arm in args.arms}
    results = {
        "start": args.start, "steps": args.steps, "seed": args.seed,
        "arms": {arm: summarise(rows[arm], rows["builtin"]) for arm in args.arms},
    }  # fmt: skip
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()

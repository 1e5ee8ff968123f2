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
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "adapters_bench.json"
ARMS = {"builtin": "agent-guess", "openenv": "agent-guess-openenv", "verifiers": "agent-guess-verifiers"}
TIME_KEYS = ("time/", "throughput/")


def run_arms(args: argparse.Namespace) -> None:
    """Start every arm at once; wait for all (with a timeout); stop them all on any exit."""
    logs = Path(args.runs) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for arm in args.arms:
            cmd = [
                sys.executable, "-m", "hone.cli", "train", ARMS[arm],
                f"run.dir={args.runs}", f"run.name={arm}", f"run.seed={args.seed}", "run.threads=1",
                f"run.steps={args.steps}", "run.time_limit_s=null", "run.save_every=100000",
                f"model.path={args.start}", "sft.enabled=false",
            ]  # fmt: skip
            log = open(logs / f"{arm}.log", "wb")  # noqa: SIM115 - closed with the process
            procs[arm] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + args.timeout_s
        for arm, proc in procs.items():
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise SystemExit(f"arm {arm} still running after {args.timeout_s} s; stopped all") from None
            if code != 0:
                raise SystemExit(f"arm {arm} failed (exit {code}): {logs}/{arm}.log")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


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

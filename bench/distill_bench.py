"""On-policy distillation vs GRPO vs both, from the same SFT start, on the default recipe (issue 35's proof).

The default recipe (`hone/recipes/default.yaml`: a ~1M-parameter Qwen2 learning 2-3 digit addition) in
three stages, each a `hone` command:

1. `start`: the recipe's SFT warm start alone (`hone sft`, no time limit: it stops at 15% validation
   accuracy), the student every arm begins from;
2. `teacher`: the recipe's GRPO from that start for `--teacher-steps` steps (the demo's RL-trained model);
3. three arms from the start, `--steps` RL steps each, held-out accuracy (the recipe's 1000 eval
   problems, greedy) every `--eval-every` steps:
   - `grpo`: the recipe's RL as it is (the teacher's own recipe, a shorter run),
   - `opd`: `distill.teacher=<teacher>`, `distill.reward=false` (reverse KL alone),
   - `opd+grpo`: `distill.teacher=<teacher>` with the recipe's GRPO advantage added.
   Both distillation arms turn `algorithm.skip_zero_variance_groups` off: an all-right or all-wrong group
   has no reward signal but every token still has the teacher's.

The arms run one after another with the same torch threads (`--threads`). Reported: accuracy at each eval
against the step and the RL wall time (the sum of the steps' `time/step_s`; evals excluded), the median
step time (steadier than the sum on a shared machine), and for each arm the first step at which its
accuracy reaches GRPO's final accuracy. The target (issue 35): OPD there in
at most half of GRPO's steps.

    nice -n 5 .venv/bin/python bench/distill_bench.py                 # start + teacher + 3 arms
    .venv/bin/python bench/distill_bench.py --report                  # reprint the table
    .venv/bin/python bench/distill_bench.py --seed 1 --results bench/results/distill_bench_seed1.json

Writes bench/results/distill_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from metrics_log import read_metrics, rl_clock

RESULTS = Path(__file__).parent / "results" / "distill_bench.json"
ARMS: dict[str, list[str]] = {
    "grpo": [],
    "opd": ["distill.reward=false", "algorithm.skip_zero_variance_groups=false"],
    "opd+grpo": ["algorithm.skip_zero_variance_groups=false"],
}


def hone(args: argparse.Namespace, command: str, name: str, *overrides: str) -> None:
    """`hone COMMAND` on the default recipe as run `name` under `--runs`, logged to `<name>.log`; skipped
    when that run finished before (`<name>.done` is there)."""
    runs = Path(args.runs)
    done = runs / f"{name}.done"
    if done.exists():
        print(f"{name}: done before ({done})", flush=True)
        return
    cmd = [
        sys.executable, "-m", "hone.cli", command, f"run.dir={runs}", f"run.name={name}",
        f"run.threads={args.threads}", "run.time_limit_s=null", "logging.progress=false", *overrides,
    ]  # fmt: skip
    runs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with (runs / f"{name}.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    done.touch()
    print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)


def arm_overrides(args: argparse.Namespace, arm: str, start: Path, teacher: Path) -> list[str]:
    distill = [] if arm == "grpo" else [f"distill.teacher={teacher}"]
    return [
        f"model.path={start}", "sft.enabled=false", f"run.steps={args.steps}", f"run.seed={args.seed}",
        f"run.eval_every={args.eval_every}", "run.save_every=0", *distill, *ARMS[arm],
    ]  # fmt: skip


def arm_name(args: argparse.Namespace, arm: str) -> str:
    return f"arm-{arm.replace('+', '-')}" + (f"-s{args.seed}" if args.seed else "")


def summarise(metrics_path: Path) -> dict[str, Any]:
    """Accuracy at every eval with its step and RL seconds so far; the mean reverse KL of the first and
    last tenth of the steps."""
    rows = read_metrics(metrics_path)
    at_step, clock = rl_clock(rows)
    evals = [[r["step"], round(at_step.get(r["step"], clock), 1), r["eval/accuracy"]]
             for r in rows if "eval/accuracy" in r]  # fmt: skip
    kl = [r["distill/reverse_kl"] for r in rows if "distill/reverse_kl" in r]
    tenth = max(1, len(kl) // 10)
    step_s = sorted(r["time/step_s"] for r in rows if "time/step_s" in r)
    return {
        "steps": len(step_s),
        "rl_s": round(clock, 1),
        "median_step_s": round(step_s[len(step_s) // 2], 3) if step_s else None,
        "evals": evals,  # [step, RL seconds, accuracy]
        "reverse_kl": [sum(kl[:tenth]) / tenth, sum(kl[-tenth:]) / tenth] if kl else None,
    }


def reached(evals: list[list[float]], target: float) -> tuple[int, float] | None:
    """The first eval's (step, RL seconds) with accuracy at or above `target`."""
    for step, seconds, accuracy in evals:
        if accuracy >= target - 1e-9:
            return int(step), seconds
    return None


def table(results: dict[str, Any]) -> str:
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    arms = results["arms"]
    target = arms["grpo"]["evals"][-1][2]
    grpo_steps = arms["grpo"]["evals"][-1][0]
    lines = [
        f"teacher: {results['teacher_steps']} GRPO steps, "
        f"held-out accuracy {pct(results['teacher_accuracy'])}; "
        f"student start {pct(arms['grpo']['evals'][0][2])}; GRPO's final accuracy (the target) {pct(target)}",
        "",
        "| arm | RL steps | RL s | median s/step | accuracy by step (step: acc) | "
        "reaches GRPO's final at step (RL s) | reverse KL first → last tenth |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, s in arms.items():
        curve = ", ".join(f"{step}: {pct(acc)}" for step, _, acc in s["evals"])
        hit = reached(s["evals"], target)
        at = "not reached" if hit is None else f"{hit[0]} ({hit[1]:.0f} s)"
        kl = "—" if s["reverse_kl"] is None else f"{s['reverse_kl'][0]:.3f} → {s['reverse_kl'][1]:.3f}"
        lines.append(
            f"| {arm} | {s['steps']} | {s['rl_s']:.0f} | {s['median_step_s']} | {curve} | {at} | {kl} |"
        )
    opd = reached(arms["opd"]["evals"], target)
    met = opd is not None and opd[0] <= grpo_steps / 2
    lines += ["", f"target (OPD at GRPO's final accuracy in at most {grpo_steps // 2} steps): "
              + ("met" if met else "not met")]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", default="runs/distill_bench")
    parser.add_argument("--teacher-steps", type=int, default=600)
    parser.add_argument("--steps", type=int, default=200, help="RL steps per arm")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the arms' run.seed (the start and teacher: 0)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON written (and --report read)")
    parser.add_argument("--report", action="store_true", help="reprint the saved results")
    args = parser.parse_args()
    if args.report:
        print(table(json.loads(args.results.read_text())))
        return
    runs = Path(args.runs).resolve()
    args.runs = str(runs)
    hone(args, "sft", "start")
    start = runs / "start" / "sft"
    hone(args, "train", "teacher", f"model.path={start}", "sft.enabled=false",
         f"run.steps={args.teacher_steps}", "run.eval_every=0", "run.save_every=0")  # fmt: skip
    teacher = runs / "teacher" / "checkpoints" / f"step-{args.teacher_steps}" / "model"
    teacher_evals = summarise(runs / "teacher" / "metrics.jsonl")["evals"]
    for arm in args.arms:
        hone(args, "train", arm_name(args, arm), *arm_overrides(args, arm, start, teacher))
    results = {
        "teacher_steps": args.teacher_steps,
        "teacher_accuracy": teacher_evals[-1][2],
        "steps": args.steps,
        "eval_every": args.eval_every,
        "threads": args.threads,
        "cores": os.cpu_count(),
        "seed": args.seed,
        "arms": {arm: summarise(runs / arm_name(args, arm) / "metrics.jsonl") for arm in args.arms},
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()

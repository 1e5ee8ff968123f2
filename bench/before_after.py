"""Hone against an earlier Hone on the same work: does a change make RL steps slower?

Each arm is a source tree (a git worktree of the old commit, and this checkout); every round trains the
same recipe in each, one after the other (alternating, so drift on a shared machine hits both), from the
same built model, and reads `time/step_s` from `metrics.jsonl`. Prints each round's median step (after
`--warmup` steps) and the ratio old / new; writes the JSON to `--out`.

    git worktree add /tmp/hone-old <old commit>
    .venv/bin/python bench/before_after.py --old /tmp/hone-old --rounds 3

Workloads (`--workload`): `tiny` is bench/vs_trl.py's tiny row (the demo's 1 M-parameter Qwen2, no SFT,
16 prompts x 8 samples x 8 new tokens); `demo` is the demo recipe's RL (32 x 8 x 8, shared prompts) after
a 40-step SFT; `demo-math` the same with the demo's math-verifier reward; `guess` a multi-turn
environment episode (agent-guess, 16 x 8, up to 8 turns); `smollm2` bench/vs_trl.py's SmolLM2 row (fp32,
4 x 8 x 48 new tokens, no SFT; `--warmup 1`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = ["run.time_limit_s=null", "run.save_every=0", "run.eval_every=0", "logging.progress=false"]
WORKLOADS = {
    "tiny": [
        "run.steps=30",
        "sft.enabled=false",
        "data.prompts_per_step=16",
        "data.eval_size=16",
        "reward.fn=length",
        "reward.args={target: 3, coef: 0.1}",
    ],
    "demo": [
        "run.steps=30",
        "sft.max_steps=40",
        "sft.val_size=40",
        "data.eval_size=16",
        "reward.fn=length",
        "reward.args={target: 3, coef: 0.1}",
    ],
    "demo-math": [  # the demo's own reward (the math verifier) on the `demo` workload
        "run.steps=30",
        "sft.max_steps=40",
        "sft.val_size=40",
        "data.eval_size=16",
    ],
    "smollm2": [  # bench/vs_trl.py's SmolLM2 row (fp32): 4 prompts x 8 samples x 48 new tokens
        "recipes/smollm2-math.yaml",
        "run.steps=4",
        "sft.enabled=false",
        "data.prompts_per_step=4",
        "data.eval_size=1",
        "rollout.n=8",
        "rollout.max_new_tokens=48",
        "rollout.temperature=0.7",
        "algorithm.kl.coef=0.0",
        "algorithm.skip_zero_variance_groups=false",
        "trainer.lr=2e-5",
        "trainer.schedule=constant",
        "trainer.micro_batch_size=256",  # vs_trl.py's: the whole batch in one forward
    ],
    "guess": [
        "recipes/agent-guess.yaml",
        "run.steps=12",
        "sft.enabled=false",
        "data.eval_size=8",
        "reward.fn=null",
        "reward.components={env: {fn: env}, len: {fn: length, args: {target: 0, coef: 0.01, cap: 100.0}}}",
    ],
}


def run_once(tree: Path, workload: str, work: Path, name: str, threads: int) -> list[float]:
    """Train `workload` with the code in `tree`; the per-step `time/step_s` of its metrics."""
    args = list(WORKLOADS[workload])
    recipe = [args.pop(0)] if args[0].endswith(".yaml") else []
    cmd = [sys.executable, "-m", "hone.cli", "train", *recipe, *args, *COMMON]
    cmd += [f"run.name={name}", f"run.dir={work}", f"run.threads={threads}"]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(threads))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{tree}: {' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
    return [row["time/step_s"] for row in rows if "time/step_s" in row]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=Path, required=True, help="source tree of the earlier Hone")
    parser.add_argument("--new", type=Path, default=REPO, help="source tree of this Hone (default: here)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of each median")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "before_after.json")
    args = parser.parse_args()
    result: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            for arm, tree in (("old", args.old), ("new", args.new)):
                steps = run_once(tree.resolve(), args.workload, Path(tmp), f"{arm}{k}", args.threads)
                median = statistics.median(steps[args.warmup :])
                result[arm].append(median)
                print(f"round {k + 1} {arm}: median step {median:.4f} s ({len(steps)} steps)", flush=True)
    old, new = statistics.median(result["old"]), statistics.median(result["new"])
    print(f"{args.workload}: old {old:.4f} s/step, new {new:.4f} s/step, old / new = {old / new:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"workload": args.workload, "old_tree": str(args.old), "rounds": result, "ratio": old / new}
    args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()

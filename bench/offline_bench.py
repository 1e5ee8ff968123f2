"""Offline RL on datasets recorded here, D4RL-style (issue 33): BC, TD3+BC, IQL and CQL on a "medium" set,
offline-to-online from the IQL run, and fitted-Q evaluation against true returns. One command:

    .venv/bin/python bench/offline_bench.py                       # Pendulum-v1 (~40 minutes on 2 cores)
    .venv/bin/python bench/offline_bench.py --env halfcheetah --medium-policy runs/halfcheetah-ppo \
        --updates 50000 --algorithms bc td3_bc iql              # HalfCheetah-v5 (~40 minutes), see below

Pendulum-v1: the behaviour policies are one SAC run (`recipes/pendulum-sac.yaml`, 20k steps, a checkpoint
every 1,000 steps). Reference scores: ref_min = a uniformly random policy's mean return (100 episodes),
ref_max = the SAC run's final deterministic eval return (10 episodes). Datasets of `--episodes` episodes
each, written by `hone collect`:
- random: the uniform policy;
- medium: the SAC checkpoint whose eval return is nearest a third of the way from ref_min to ref_max
  (normalized score 33), its stochastic actions;
- medium-replay: the SAC run's checkpoints up to that one, early to late, sharing the episodes (D4RL's
  medium-replay is the replay buffer of the medium run; Hone's SAC buffer keeps no episode boundaries,
  so the run's checkpoints stand in for its history);
- expert: the final SAC policy, its stochastic actions.

On "medium", each algorithm × seed trains `--updates` gradient updates (`recipes/pendulum-iql.yaml` with
`control.algorithm` set), and its final deterministic eval (10 episodes, fixed seeds) is normalized with
the dataset's reference scores. The behaviour policy's score is the dataset's own mean episode return,
normalized. Target: IQL and TD3+BC beat BC and the behaviour policy by >= 5 normalized points.

Offline-to-online: from the IQL seed-0 run (`hone train --init`), `--online-steps` environment steps of
IQL with the dataset in the buffer, against IQL from freshly initialised networks with the same buffer
and steps (what the offline phase bought). OPE: FQE (`hone eval --ope`, on the medium and the medium-replay
sets) of 4 SAC checkpoints spread over the run's eval returns, against each one's true discounted return;
Spearman's rank correlation.

`--env halfcheetah`: HalfCheetah-v5 with D4RL's reference scores (-280.18 and 12,135.0) and a Hone PPO
policy at about a third of that (`hone train halfcheetah-ppo`, 1M steps, passed with `--medium-policy`)
as "medium"; random and medium sets only (an expert policy takes GPU-hours of SAC), the four algorithms
on medium.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HONE = [sys.executable, "-m", "hone.cli"]
ALGORITHMS = ("bc", "td3_bc", "iql", "cql")
D4RL_HALFCHEETAH = (-280.178953, 12135.0)  # D4RL's REF_MIN_SCORE / REF_MAX_SCORE for halfcheetah


def hone(*args: str) -> str:
    done = subprocess.run([*HONE, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"hone {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_eval(run: Path) -> float:
    return [r for r in rows(run) if "eval/return" in r][-1]["eval/return"]


def random_return(env_id: str, episodes: int) -> float:
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(0)
    totals = []
    for i in range(episodes):
        env.reset(seed=i)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + float(reward), terminated or truncated
        totals.append(total)
    return float(np.mean(totals))


def collect(
    recipe: str,
    policies: list[str],
    name: str,
    root: Path,
    episodes: int,
    refs: tuple[float, float],
    *extra: str,
) -> float:
    """Record a dataset; returns its behaviour policies' mean episode return."""
    if (root / name).exists():  # made by an earlier invocation: kept, its episodes' mean return read back
        import minari

        data = minari.MinariDataset(str(root / name / "data"))
        mean = float(np.mean([np.sum(e.rewards) for e in data.iterate_episodes()]))
        print(f"  {name}: exists, kept (behaviour return {mean:.1f})")
        return mean
    args = [f"--policy={p}" for p in policies]
    out = hone(
        "collect",
        recipe,
        *args,
        f"--episodes={episodes}",
        f"--dataset-id={name}",
        f"--out={root}",
        f"--ref-min-score={refs[0]}",
        f"--ref-max-score={refs[1]}",
        *extra,
    )
    line = next(x for x in out.splitlines() if x.startswith("behaviour return"))
    print(f"  {name}: {line}")
    return float(line.split()[2])


def normalized(value: float, refs: tuple[float, float]) -> float:
    return 100.0 * (value - refs[0]) / (refs[1] - refs[0])


def run_name(algorithm: str, updates: int, seed: int) -> str:
    return f"{algorithm}-{updates // 1000}k-s{seed}"


def train_offline(
    recipe: str, algorithm: str, seed: int, dataset: str, root: Path, runs: Path, updates: int, *extra: str
) -> Path:
    name = run_name(algorithm, updates, seed)
    if (runs / name / "model").is_dir():  # done by an earlier invocation: its result is kept
        return runs / name
    hone(
        "train",
        recipe,
        f"control.algorithm={algorithm}",
        f"run.seed={seed}",
        f"run.name={name}",
        f"run.dir={runs}",
        f"data.source=minari:{dataset}",
        f"control.offline.dataset_root={root}",
        f"control.offline.updates={updates}",
        "logging.plot=[]",
        "logging.progress=false",
        *extra,
    )
    return runs / name


def spearman(x: list[float], y: list[float]) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def pendulum(args: argparse.Namespace, work: Path, report: dict) -> None:
    runs, root, prefix = work / "runs", work / "datasets", "hone/pendulum"
    expert = runs / "pendulum-expert"
    if not (expert / "model").is_dir():
        print("training the behaviour policies: SAC on Pendulum-v1, 20k steps")
        hone(
            "train",
            "pendulum-sac",
            f"run.dir={runs}",
            "run.name=pendulum-expert",
            "run.save_every=5",
            "run.keep_last=100",
            "run.eval_every=5",
            "logging.plot=[]",
            "logging.progress=false",
        )
    evals = {r["step"]: r["eval/return"] for r in rows(expert) if "eval/return" in r}
    refs = (random_return("Pendulum-v1", 100), final_eval(expert))
    checkpoints = {s: expert / "checkpoints" / f"step-{s}" / "model" for s in evals}
    checkpoints = {s: p for s, p in checkpoints.items() if p.is_dir()}
    medium_step = min(checkpoints, key=lambda s: abs(normalized(evals[s], refs) - 33.0))
    report["refs"] = refs
    report["medium_checkpoint"] = {"step": medium_step, "eval_return": evals[medium_step]}
    print(
        f"ref_min {refs[0]:.1f}, ref_max {refs[1]:.1f}; medium = SAC step {medium_step} "
        f"(eval {evals[medium_step]:.1f}, normalized {normalized(evals[medium_step], refs):.1f})"
    )
    early = [str(checkpoints[s]) for s in sorted(checkpoints) if s <= medium_step]
    behaviour = {
        "random": collect("pendulum-sac", ["random"], f"{prefix}/random-v0", root, args.episodes, refs),
        "medium": collect(
            "pendulum-sac", [str(checkpoints[medium_step])], f"{prefix}/medium-v0", root, args.episodes, refs
        ),
        "medium-replay": collect(
            "pendulum-sac", ["random", *early], f"{prefix}/medium-replay-v0", root, args.episodes, refs
        ),
        "expert": collect("pendulum-sac", [str(expert)], f"{prefix}/expert-v0", root, args.episodes, refs),
    }
    report["datasets"] = {k: {"return": v, "normalized": normalized(v, refs)} for k, v in behaviour.items()}
    if "table" in args.parts:
        table(args, "pendulum-iql", f"{prefix}/medium-v0", root, runs, refs, behaviour["medium"], report)
    if "online" in args.parts:
        online(args, f"{prefix}/medium-v0", root, runs, report)
    if "ope" in args.parts:
        sets = [f"{prefix}/medium-v0", f"{prefix}/medium-replay-v0"]
        ope(args, expert, sorted(checkpoints), evals, sets, root, report)


def table(
    args: argparse.Namespace,
    recipe: str,
    dataset: str,
    root: Path,
    runs: Path,
    refs: tuple[float, float],
    behaviour: float,
    report: dict,
) -> None:
    jobs = [(a, s) for a in args.algorithms for s in args.seeds]
    started = time.perf_counter()
    cql = [f"control.offline.cql_samples={args.cql_samples}"]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(
            pool.map(
                lambda job: train_offline(
                    recipe,
                    job[0],
                    job[1],
                    dataset,
                    root,
                    runs,
                    args.updates,
                    *(cql if job[0] == "cql" else []),
                ),
                jobs,
            )
        )
    scores: dict[str, list[float]] = {}
    for (algorithm, _), run in zip(jobs, done, strict=True):
        scores.setdefault(algorithm, []).append(normalized(final_eval(run), refs))
    report["offline"] = {
        a: {"scores": s, "mean": float(np.mean(s)), "std": float(np.std(s))} for a, s in scores.items()
    }
    report["offline"]["behaviour"] = {"mean": normalized(behaviour, refs)}
    print(f"\n{dataset}, {args.updates} updates, seeds {args.seeds} ({time.perf_counter() - started:.0f} s):")
    print("| behaviour | " + " | ".join(args.algorithms) + " |")
    print("|---|" + "---|" * len(args.algorithms))
    cells = [f"{np.mean(scores[a]):.1f} ± {np.std(scores[a]):.1f}" for a in args.algorithms]
    print(f"| {normalized(behaviour, refs):.1f} | " + " | ".join(cells) + " |")


def online(args: argparse.Namespace, dataset: str, root: Path, runs: Path, report: dict) -> None:
    common = [
        "control.offline.updates=0",
        f"control.offline.online_steps={args.online_steps}",
        "run.eval_every=5",
    ]
    seed = args.seeds[0]
    pairs = [
        ("online-from-iql", ["--init", str(runs / run_name("iql", args.updates, seed))]),
        ("online-scratch", []),
    ]
    curves = {}
    for name, init in pairs:
        hone(
            "train",
            "pendulum-iql",
            *init,
            "control.algorithm=iql",
            f"run.seed={seed}",
            f"run.name={name}",
            f"run.dir={runs}",
            f"data.source=minari:{dataset}",
            f"control.offline.dataset_root={root}",
            "logging.plot=[]",
            "logging.progress=false",
            *common,
        )
        curves[name] = [
            (r.get("env/steps", 0.0), r["eval/return"]) for r in rows(runs / name) if "eval/return" in r
        ]
    report["offline_to_online"] = curves
    print(f"\noffline-to-online, {args.online_steps} env steps: eval return (env steps)")
    for name, curve in curves.items():
        print(f"  {name:16s} " + "  ".join(f"{r:.0f}@{s:.0f}" for s, r in curve))


def ope(
    args: argparse.Namespace,
    expert: Path,
    steps: list[int],
    evals: dict[int, float],
    datasets: list[str],
    root: Path,
    report: dict,
) -> None:
    from hone.config import load_config
    from hone.control.evaluate import load_policy
    from hone.control.ope import discounted_return

    # 4 checkpoints spread over the range of eval returns (not of steps: SAC's late ones are all alike)
    low, high = min(evals[s] for s in steps), max(evals[s] for s in steps)
    picked = sorted({min(steps, key=lambda s: abs(evals[s] - t)) for t in np.linspace(low, high, 4)})
    control = load_config(expert / "config.yaml").control
    assert control is not None
    truths = []
    for step in picked:
        policy, normalizer, _ = load_policy(control, expert / "checkpoints" / f"step-{step}" / "model")
        truths.append(discounted_return(policy, control, normalizer, gamma=0.99, episodes=10))
    report["ope"] = {"steps": picked, "true_discounted": truths}
    for dataset in datasets:  # a narrow dataset (medium) and a broad one (medium-replay)
        fqe_ranking(expert, picked, evals, truths, dataset, root, report)


def fqe_ranking(
    expert: Path, picked: list[int], evals: dict[int, float], truths: list[float], dataset: str, root: Path,
    report: dict,
) -> None:  # fmt: skip
    estimates = []
    for step in picked:
        out = hone(
            "eval",
            "--run",
            str(expert),
            "--step",
            str(step),
            "--ope",
            f"data.source=minari:{dataset}",
            f"control.offline.dataset_root={root}",
        )
        estimates.append(float(next(x for x in out.split("\n") if "ope/fqe_return" in x).split()[-1]))
    rho = spearman(estimates, truths)
    report["ope"][dataset] = {"fqe": estimates, "spearman": rho}
    print(f"\nFQE on {dataset} vs true discounted return (10 episodes):")
    for step, e, t in zip(picked, estimates, truths, strict=True):
        print(f"  SAC step {step:3d} (eval {evals[step]:7.1f}): FQE {e:8.1f}  true {t:8.1f}")
    print(f"  Spearman rank correlation {rho:.2f}")


def halfcheetah(args: argparse.Namespace, work: Path, report: dict) -> None:
    if args.medium_policy is None:
        raise SystemExit("--env halfcheetah needs --medium-policy runs/<a halfcheetah-ppo run>")
    runs, root, prefix, refs = work / "runs", work / "datasets", "hone/halfcheetah", D4RL_HALFCHEETAH
    behaviour = {
        "random": collect("halfcheetah-sac", ["random"], f"{prefix}/random-v0", root, args.episodes, refs),
        "medium": collect(
            "halfcheetah-sac", [args.medium_policy], f"{prefix}/medium-v0", root, args.episodes, refs
        ),
    }
    report["refs"] = refs
    report["datasets"] = {k: {"return": v, "normalized": normalized(v, refs)} for k, v in behaviour.items()}
    table(args, "halfcheetah-iql", f"{prefix}/medium-v0", root, runs, refs, behaviour["medium"], report)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", choices=["pendulum", "halfcheetah"], default="pendulum")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--updates", type=int, default=10_000, help="offline gradient updates per run")
    parser.add_argument("--episodes", type=int, default=100, help="episodes per dataset")
    parser.add_argument("--online-steps", type=int, default=10_000)
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["table", "online", "ope"],
        default=["table", "online", "ope"],
        help="pendulum: which comparisons to run (the datasets and the SAC run are made once and kept)",
    )
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument(
        "--cql-samples",
        type=int,
        default=4,
        help="CQL's sampled actions per kind (10 in CORL: 80 ms/update here)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="training runs side by side")
    parser.add_argument("--medium-policy", help="halfcheetah: the medium behaviour policy (a run directory)")
    parser.add_argument("--work", default="/tmp/hone-offline-bench", help="runs and datasets go here")
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args()
    work = Path(args.work) / args.env
    report: dict = {"env": args.env, "updates": args.updates, "seeds": args.seeds}
    (pendulum if args.env == "pendulum" else halfcheetah)(args, work, report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""Asynchronous training (`cluster.mode: async`) against synchronous, on this machine and simulated.

1. Real: `hone.rl.loop.train` with the tiny model (`model.path: tiny`, from scratch) on a
   workload where sampling is not the only cost: `SlowToolEnv`, a multi-turn tool environment whose
   every tool call waits 100-300 ms (long-tailed within that range; a turn waits for its slowest call,
   as a batch of agents does), episodes of 1-4 turns (long-tailed: 40/30/20/10%), and a reward served
   like a local judge (`digit_judge`: an async call with lognormal latency, median 50 ms, 64 at a time).
   The batch is `agent-retry`'s shape (32 prompts x 8, 8 tokens a turn, two PPO mini-batches a step).
   The reward is the share of digits in everything the agent wrote, which a random model earns ~4% of
   and GRPO raises within a minute, so reward against wall time is a curve. Every arm gets the same
   wall-time budget (`run.time_limit_s`): sync, async with eta = 1, 2, 4 (naive PPO: the sampler's
   log-probs are the anchor), eta = 4 with AReaL's decoupled objective (`old_log_probs: recompute`,
   `off_policy.name: decoupled`), eta = 1 pinned (main thread on core 0, producer thread on core 1, one
   torch thread each), and two producers (`cluster.producers: 2`) at eta = 2 and 4, naive and decoupled.
   Trajectories/s counts trained trajectories over the RL wall time (first step begun to last step
   done); the learner is idle when it waits for groups (`take`) or in a publish (which no longer waits
   for the producer: the column stays as evidence).
2. Simulated split devices: the real rollout source, its executors and `LocalWeightChannel`, with fake
   producers that sleep a lognormal sampling time per step (sigma 1, mean 1x and 2x the learner's step)
   and a learner that sleeps a fixed step, under the source's own admission rule (step s submitted once
   s - eta steps are trained). Nothing competes for cores: this is the scheduling
   gain alone, eta = 0, 1, 2, 4, 8 with one producer, 2, 4, 8 with two and four, against sync.

    .venv/bin/python bench/async_bench.py     # ~30 minutes (60 s an arm); --arm-seconds 5: a smoke run

Prints a table and writes bench/results/async_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import torch

from hone.config import load_config
from hone.envs import Environment, Message, StepResult, register_env
from hone.rewards.registry import register_reward
from hone.rl import loop
from hone.rl.learner import Learner
from hone.rl.placement.executors import InlineExecutor, ThreadExecutor
from hone.rl.placement.source import Executor, Rollouts
from hone.rl.placement.weights import LocalWeightChannel
from hone.rl.producer import PromptBatch, ScoredGroups
from hone.types import Rollout, Sample

RESULTS = Path(__file__).parent / "results" / "async_bench.json"
TURNS = [1, 2, 3, 4]
TURN_WEIGHTS = [0.4, 0.3, 0.2, 0.1]


def _rng(*key: object) -> random.Random:
    return random.Random("/".join(map(str, key)))  # str seeds hash deterministically (not PYTHONHASHSEED)


@register_env("bench_slow_tool")
class SlowToolEnv(Environment):
    """Each assistant turn is a tool call that takes 100-300 ms (lognormal above 100 ms, capped); the
    episode ends after the number of calls its prompt needs (1-4). Rewards come from `digit_judge`."""

    max_turns = max(TURNS)

    def __init__(self) -> None:
        self.sample_id, self.turns, self.needed = "", 0, 1

    @classmethod
    def make_samples(cls, n: int, seed: int, split: str, **args: Any) -> list[Sample]:
        return [Sample(id=f"{split}-{seed}-{i}", prompt=f"task {i}: call the tool") for i in range(n)]

    def reset(self, sample: Sample) -> list[Message]:
        self.sample_id, self.turns = sample.id, 0
        self.needed = _rng(sample.id).choices(TURNS, TURN_WEIGHTS)[0]
        return [{"role": "user", "content": sample.prompt or ""}]

    async def step(self, assistant_message: str) -> StepResult:
        self.turns += 1
        delay = 0.1 + _rng(self.sample_id, self.turns, assistant_message).lognormvariate(math.log(0.05), 0.8)
        await asyncio.sleep(min(delay, 0.3))
        done = self.turns >= self.needed
        return StepResult([] if done else [{"role": "user", "content": "ok"}], done=done)


@register_reward("bench_digit_judge")
def digit_judge() -> Any:
    """A judge behind a network call: lognormal latency (median 50 ms, long tail capped at 2 s); the
    score is the share of digit characters in every message the agent wrote."""

    async def judge(rollout: Rollout, sample: Sample) -> float:
        text = rollout.assistant_text("all")
        await asyncio.sleep(min(_rng("judge", sample.id, text).lognormvariate(math.log(0.05), 1.0), 2.0))
        return sum(c.isdigit() for c in text) / max(1, len(text))

    return judge


def real_overrides(run_dir: str, name: str, seconds: float, **extra: object) -> list[str]:
    base: dict[str, object] = {
        "run.dir": run_dir,
        "run.name": name,
        "run.steps": 100_000,
        "run.time_limit_s": seconds,
        "run.save_every": 0,
        "run.eval_every": 0,
        "run.threads": 2,
        "model.path": "tiny",
        "sft.enabled": "false",
        "data.task": "null",
        "data.task_args": "{}",
        "data.train_size": 4096,
        "data.eval_size": 64,
        "data.prompts_per_step": 32,
        "rollout.n": 8,
        "rollout.max_new_tokens": 8,
        "env.name": "bench_slow_tool",
        "env.max_tokens_per_turn": 8,
        "env.max_total_tokens": 160,
        "reward.fn": "bench_digit_judge",
        "reward.max_concurrency": 64,
        "algorithm.skip_zero_variance_groups": "false",
        "trainer.lr": 1e-3,
        "trainer.mini_batches": 2,
        "logging.progress": "false",
        "logging.tensorboard": "false",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


ASYNC = {"cluster.mode": "async"}
DECOUPLED = {"algorithm.old_log_probs": "recompute", "algorithm.off_policy.name": "decoupled"}
INTERRUPTIBLE = {"rollout.interruptible": "true"}
TWO_BY_STEPS = {"cluster.producers": 2, "cluster.producer_split": "steps"}
ARMS: list[tuple[str, dict[str, object]]] = [
    ("sync", {}),
    ("async eta=1", {**ASYNC, "cluster.max_staleness": 1}),
    ("async eta=2", {**ASYNC, "cluster.max_staleness": 2}),
    ("async eta=4", {**ASYNC, "cluster.max_staleness": 4}),
    ("async eta=4 decoupled", {**ASYNC, "cluster.max_staleness": 4, **DECOUPLED}),
    ("async eta=1 pinned", {**ASYNC, "cluster.max_staleness": 1, "run.threads": 1}),
    ("async eta=2, 2 producers", {**ASYNC, "cluster.max_staleness": 2, "cluster.producers": 2}),
    ("async eta=4, 2 producers", {**ASYNC, "cluster.max_staleness": 4, "cluster.producers": 2}),
    (
        "async eta=2, 2 producers, decoupled",
        {**ASYNC, "cluster.max_staleness": 2, "cluster.producers": 2, **DECOUPLED},
    ),
    (
        "async eta=4, 2 producers, decoupled",
        {**ASYNC, "cluster.max_staleness": 4, "cluster.producers": 2, **DECOUPLED},
    ),
    # Issue 34: interruptible rollouts (a publish lands between two tokens), and the staleness controller
    # against the fixed η of {0 (sync), 1, 2, 4, 8} with two producers.
    (
        "async eta=2, 2 producers, interruptible",
        {**ASYNC, "cluster.max_staleness": 2, "cluster.producers": 2, **INTERRUPTIBLE},
    ),
    (
        "async eta=2, 2 producers, interruptible, decoupled",
        {**ASYNC, "cluster.max_staleness": 2, "cluster.producers": 2, **INTERRUPTIBLE, **DECOUPLED},
    ),
    ("async eta=1, 2 producers", {**ASYNC, "cluster.max_staleness": 1, "cluster.producers": 2}),
    ("async eta=8, 2 producers", {**ASYNC, "cluster.max_staleness": 8, "cluster.producers": 2}),
    ("async auto, 2 producers", {**ASYNC, "cluster.max_staleness": "auto", "cluster.producers": 2}),
    ("async eta=2, 2 producers, steps", {**ASYNC, "cluster.max_staleness": 2, **TWO_BY_STEPS}),
    (
        "async eta=2, 2 producers, steps, interruptible",
        {**ASYNC, "cluster.max_staleness": 2, **TWO_BY_STEPS, **INTERRUPTIBLE},
    ),
    (
        "async eta=2, 2 producers, steps, decoupled",
        {**ASYNC, "cluster.max_staleness": 2, **TWO_BY_STEPS, **DECOUPLED},
    ),
    (
        "async eta=2, 2 producers, steps, interruptible, decoupled",
        {**ASYNC, "cluster.max_staleness": 2, **TWO_BY_STEPS, **INTERRUPTIBLE, **DECOUPLED},
    ),
    ("async eta=1, 2 producers, steps", {**ASYNC, "cluster.max_staleness": 1, **TWO_BY_STEPS}),
    ("async eta=4, 2 producers, steps", {**ASYNC, "cluster.max_staleness": 4, **TWO_BY_STEPS}),
    ("async eta=8, 2 producers, steps", {**ASYNC, "cluster.max_staleness": 8, **TWO_BY_STEPS}),
    ("async auto, 2 producers, steps", {**ASYNC, "cluster.max_staleness": "auto", **TWO_BY_STEPS}),
]


class _Recorder:
    """Times every RL step, the learner's work and its publish waits, through the loop's own calls."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.rows: list[dict[str, float]] = []
        self.learn_s = 0.0
        self.publish_s = 0.0
        self.trajectories = 0

    @contextmanager
    def patched(self, pin: bool) -> Iterator[None]:
        real_step, real_learn = loop.learn_step, Learner.learn
        real_publish = {cls: cls.publish for cls in (Rollouts,)}
        real_produce_all = ThreadExecutor._produce_all

        def step(step: int, rollouts: Any, learner: Learner, lead: Any = None) -> Any:
            self.start = time.perf_counter() if self.start is None else self.start
            groups, metrics = real_step(step, rollouts, learner, lead)
            metrics["t"] = time.perf_counter() - self.start
            self.rows.append(metrics)  # the loop's own dict: what it adds after the step lands here too
            return groups, metrics

        def learn(learner: Learner, groups: ScoredGroups, step: int) -> dict[str, Any]:
            t0 = time.perf_counter()
            self.trajectories += len(groups.rollouts)
            out = real_learn(learner, groups, step)
            self.learn_s += time.perf_counter() - t0
            return out

        def publishing(cls: type) -> Any:
            def publish(rollouts: Any, version: int) -> None:
                t0 = time.perf_counter()
                real_publish[cls](rollouts, version)
                self.publish_s += time.perf_counter() - t0

            return publish

        def produce_pinned(rollouts: ThreadExecutor, *worker: Any) -> None:
            os.sched_setaffinity(0, {1})  # pid 0: this thread only
            torch.set_num_threads(1)  # OpenMP's thread count is per calling thread
            real_produce_all(rollouts, *worker)

        loop.learn_step, Learner.learn = step, learn  # type: ignore[method-assign]
        for cls in real_publish:
            cls.publish = publishing(cls)  # type: ignore[method-assign]
        cores = os.sched_getaffinity(0)
        if pin:
            ThreadExecutor._produce_all = produce_pinned  # type: ignore[method-assign]
            os.sched_setaffinity(0, {0})
        try:
            yield
        finally:
            loop.learn_step, Learner.learn = real_step, real_learn  # type: ignore[method-assign]
            for cls, fn in real_publish.items():
                cls.publish = fn  # type: ignore[method-assign]
            ThreadExecutor._produce_all = real_produce_all  # type: ignore[method-assign]
            os.sched_setaffinity(0, cores)
            torch.set_num_threads(len(cores))


def _mean(rows: list[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else None


def run_arm(name: str, extra: dict[str, object], seconds: float, run_dir: str) -> dict[str, Any]:
    cfg = load_config(None, real_overrides(run_dir, name.replace(" ", "_"), seconds, **extra))
    rec = _Recorder()
    with rec.patched(pin="pinned" in name):
        result = loop.train(cfg)
    wall = rec.rows[-1]["t"]
    # Learner work: its steps, less the time its publishes waited for the producer's safe point.
    busy = rec.learn_s - rec.publish_s
    return {
        "arm": name,
        "steps": len(rec.rows),
        "rl_wall_s": wall,
        "trajectories_per_s": rec.trajectories / wall,
        "steps_per_s": len(rec.rows) / wall,
        "learner_idle_frac": 1 - busy / wall,
        "publish_wait_frac": rec.publish_s / wall,
        "logged_learner_idle_frac": _mean(rec.rows, "time/learner_idle_frac"),
        "producer_idle_frac": _mean(rec.rows, "time/producer_idle_frac"),
        "staleness_mean": _mean(rec.rows, "staleness/mean"),
        "staleness_max": max((r.get("staleness/max", 0.0) for r in rec.rows), default=0.0),
        "sample_s": _mean(rec.rows, "time/sample_s"),
        "reward_s": _mean(rec.rows, "time/reward_s"),
        "interrupted_frac": _mean(rec.rows, "staleness/interrupted_frac"),
        "staleness_limit": _mean(rec.rows, "staleness/limit"),
        "ess": _mean(rec.rows, "offpolicy/ess"),
        "ess_seq": _mean(rec.rows, "offpolicy/ess_seq"),
        "learn_s": busy / len(rec.rows),
        "curve": [(r["t"], r["reward/mean"]) for r in rec.rows],
        "eval_reward_start": result.start_eval.get("eval/reward"),
        "eval_reward_end": result.final_eval.get("eval/reward"),
    }


def reward_at(curve: list[tuple[float, float]], lo: float, hi: float) -> float | None:
    """Mean training reward of the steps that ended in the wall-time window [lo, hi)."""
    values = [r for t, r in curve if lo <= t < hi]
    return statistics.fmean(values) if values else None


def reward_after_steps(curve: list[tuple[float, float]], steps: int, last: int = 10) -> float:
    """Mean training reward of steps `steps - last` .. `steps` (equal-step comparison)."""
    return statistics.fmean(r for _, r in curve[max(0, steps - last) : steps])


class _SimSampler:
    """Stands in for the sampler on the weight channel: only a version."""

    policy_version = 0

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        self.policy_version = version


class _SimProducer:
    """Samples a step by sleeping its drawn latency (its own device: sleeping takes no core)."""

    def __init__(self, weights: LocalWeightChannel, latencies: list[float], groups: int) -> None:
        self.weights, self.latencies, self.groups = weights, latencies, groups

    def produce(self, prompts: PromptBatch) -> ScoredGroups:
        version = self.weights.version
        time.sleep(self.latencies[prompts.step])
        rollouts = [
            Rollout(
                sample_id=str(g),
                group_id=g,
                token_ids=[0],
                prompt_len=1,
                loss_mask=[],
                sampler_logprobs=[],
                policy_version=version,
            )
            for g in range(self.groups)
        ]
        return ScoredGroups(step=prompts.step, rollouts=rollouts, metrics={}, new_tokens=0)

    def interrupt(self) -> None:
        """Nothing to stop: a sleep ends on its own."""


class _SimPlan:
    """One prompt per producer a step (a share each), nothing learnt from outcomes."""

    def __init__(self, prompts: int) -> None:
        self.prompts = prompts

    def batch(self, step: int) -> list[Sample]:
        return [Sample(id=f"{step}-{k}", prompt="p") for k in range(self.prompts)]

    def observe(self, step: int, outcomes: Any) -> dict[str, float]:
        return {}


def simulate(
    eta: int | None, latencies: list[float], learn_s: float, producers: int = 1, whole_steps: bool = False
) -> dict[str, float]:
    """Steps/s of `len(latencies)` steps; eta None = the inline executor, else the thread executor under eta
    with `producers` producers (each its own sampler and channel, as `cluster.producers` builds them; each
    produces a share of every step, here taking the step's latency: a share waits on its slowest too)."""
    workers = []
    for _ in range(producers):
        weights = LocalWeightChannel(dict, _SimSampler(), timeout_s=60)  # type: ignore[arg-type]
        workers.append((_SimProducer(weights, latencies, groups=4), weights))
    (producer, weights) = workers[0]
    executor: Executor = (
        InlineExecutor(producer, weights)  # type: ignore[arg-type]
        if eta is None
        else ThreadExecutor(workers)  # type: ignore[arg-type]
    )
    steps, lags, publish_s = len(latencies), [], 0.0
    plan = _SimPlan(1 if whole_steps else producers)
    source = Rollouts(
        executor, plan, start=0, steps=steps, ahead=eta or 0, version=0, whole_steps=whole_steps
    )
    t0 = time.perf_counter()
    with closing(source):
        for step in range(steps):
            groups = source.take()
            lags += [weights.published - r.policy_version for r in groups.rollouts]
            time.sleep(learn_s)  # the learner's device
            published = time.perf_counter()
            source.publish(step + 1)
            publish_s += time.perf_counter() - published
    wall = time.perf_counter() - t0
    return {
        "steps_per_s": steps / wall,
        "learner_idle_frac": 1 - steps * learn_s / wall,
        "publish_wait_frac": publish_s / wall,
        "staleness_mean": statistics.fmean(lags),
        "staleness_max": max(lags),
    }


# Sampling as long as learning on average, and twice as long (the real arms' sync step: 61% sampling).
SIM_SAMPLE_RATIOS = (1.0, 2.0)
SIM_ARMS: list[tuple[str, int | None, int, bool]] = [  # (arm, eta (None: sync), producers, whole steps)
    ("sync", None, 1, False),
    *[(f"async eta={eta}", eta, 1, False) for eta in (0, 1, 2, 4, 8)],
    *[(f"async eta={eta}, {k} producers", eta, k, False) for k in (2, 4) for eta in (2, 4, 8)],
    *[(f"async eta={eta}, {k} producers, steps", eta, k, True) for k in (2, 4) for eta in (2, 4, 8)],
]


def run_simulation(steps: int, learn_s: float, sample_ratio: float) -> list[dict[str, Any]]:
    """The arms on one draw of step latencies: lognormal (sigma 1; median 0.61 x mean, 1 step in 20 over
    3.1 x mean) with mean `sample_ratio` x the learner's step."""
    rng = random.Random(0)
    sigma, mean = 1.0, sample_ratio * learn_s
    latencies = [mean * math.exp(rng.gauss(0, sigma) - sigma**2 / 2) for _ in range(steps)]
    rows = [
        {"arm": arm, "sample_ratio": sample_ratio} | simulate(eta, latencies, learn_s, producers, whole)
        for arm, eta, producers, whole in SIM_ARMS
    ]
    for row in rows:
        row["speedup"] = row["steps_per_s"] / rows[0]["steps_per_s"]
    return rows


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_real(rows: list[dict[str, Any]]) -> None:
    base = rows[0]
    horizon = min(r["rl_wall_s"] for r in rows)
    quarters = [(horizon * i / 4, horizon * (i + 1) / 4) for i in range(4)]
    print(f"\n1. real: tiny model, slow tool env + judge, {horizon:.0f}+ s of RL per arm, 2 cores")
    print(
        f"{'arm':>22} {'steps':>5} {'traj/s':>7} {'ratio':>6} {'learner idle':>12} {'prod idle':>9} "
        f"{'stale':>9} {'sample+tools s':>14} {'judge s':>7} {'learn s':>7}  reward by wall-time quarter"
        "   eval start->end"
    )
    for r in rows:
        r["speedup"] = r["trajectories_per_s"] / base["trajectories_per_s"]
        r["reward_quarters"] = [reward_at(r["curve"], lo, hi) for lo, hi in quarters]
        stale = f"{_fmt(r['staleness_mean'], '.1f')}/{r['staleness_max']:.0f}"
        curve = " ".join(_fmt(q, ".3f") for q in r["reward_quarters"])
        evals = f"{_fmt(r['eval_reward_start'], '.3f')}->{_fmt(r['eval_reward_end'], '.3f')}"
        print(
            f"{r['arm']:>22} {r['steps']:>5} {r['trajectories_per_s']:>7.1f} {r['speedup']:>5.2f}x "
            f"{r['learner_idle_frac']:>12.2f} {_fmt(r['producer_idle_frac']):>9} {stale:>9} "
            f"{_fmt(r['sample_s']):>14} {_fmt(r['reward_s']):>7} {r['learn_s']:>7.2f}  {curve}   {evals}"
        )
    naive, decoupled = rows[3], rows[4]
    steps = min(naive["steps"], decoupled["steps"])
    for r in (naive, decoupled):
        r["reward_at_equal_steps"] = reward_after_steps(r["curve"], steps)
    print(
        f"eta=4 at equal steps ({steps}, mean training reward of the last 10): naive PPO "
        f"{naive['reward_at_equal_steps']:.3f}, decoupled {decoupled['reward_at_equal_steps']:.3f}"
    )


def print_sim(rows: list[dict[str, Any]], steps: int, learn_s: float) -> None:
    for ratio in sorted({r["sample_ratio"] for r in rows}):
        print(
            f"\n2. simulated split devices: {steps} steps, learner step {learn_s:.2f} s, sampler step "
            f"lognormal (sigma 1) with mean {ratio:g} x that"
        )
        print(
            f"{'arm':>26} {'steps/s':>8} {'speedup':>8} {'learner idle':>12} "
            f"{'publish wait':>12} {'stale':>9}"
        )
        for r in rows:
            if r["sample_ratio"] != ratio:
                continue
            stale = f"{r['staleness_mean']:.2f}/{r['staleness_max']:.0f}"
            print(
                f"{r['arm']:>26} {r['steps_per_s']:>8.2f} {r['speedup']:>7.2f}x "
                f"{r['learner_idle_frac']:>12.2f} {r['publish_wait_frac']:>12.2f} {stale:>9}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm-seconds", type=float, default=60.0, help="wall-time budget of each real arm")
    parser.add_argument("--sim-steps", type=int, default=80)
    parser.add_argument("--sim-learn-s", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--report", action="store_true", help="print the tables of --out; run nothing")
    parser.add_argument(
        "--arms", nargs="+", help="run only these real arms (by name), replacing them in --out's results"
    )
    parser.add_argument(
        "--sim-only", action="store_true", help="run only the simulation, replacing it in --out's results"
    )
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.report else measure(args)
    print_sim(results["simulated"], **results["config"]["sim"])
    print_real(results["real"])
    args.out.write_text(json.dumps(results, indent=1) + "\n")  # with the ratios print_real added
    print(f"\nwritten to {args.out}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The real arms, then the simulation; results are rewritten after each arm (kept if one fails)."""
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 cores (the pinned arm puts the producer on core 1)")
    sim = {"steps": args.sim_steps, "learn_s": args.sim_learn_s}
    results: dict[str, Any] = {"config": {"arm_seconds": args.arm_seconds, "sim": sim}, "real": []}
    args.out.parent.mkdir(exist_ok=True)
    if args.sim_only:
        results = json.loads(args.out.read_text())
        results["config"]["sim"] = sim
        results["simulated"] = [
            row
            for ratio in SIM_SAMPLE_RATIOS
            for row in run_simulation(args.sim_steps, args.sim_learn_s, ratio)
        ]
        return results
    if args.arms:  # a partial run: the other arms and the simulation stay as --out has them
        unknown = set(args.arms) - {name for name, _ in ARMS}
        if unknown:
            raise SystemExit(f"unknown arms {sorted(unknown)}; the arms are {[name for name, _ in ARMS]}")
        results = json.loads(args.out.read_text())
    with tempfile.TemporaryDirectory() as run_dir:
        for name, extra in ARMS:
            if args.arms and name not in args.arms:
                continue
            row = run_arm(name, extra, args.arm_seconds, run_dir)
            kept = [r for r in results["real"] if r["arm"] != name]
            results["real"] = sorted([*kept, row], key=lambda r: [n for n, _ in ARMS].index(r["arm"]))
            print(f"  {name}: {row['steps']} steps", flush=True)
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    if args.arms:
        return results
    results["simulated"] = [
        row for ratio in SIM_SAMPLE_RATIOS for row in run_simulation(args.sim_steps, args.sim_learn_s, ratio)
    ]
    return results


if __name__ == "__main__":
    main()

"""The Ray back-end (`cluster.backend: ray`): the run's learner, samplers and reward workers as Ray actors.

The driver (`hone train`, or the entry point of a `ray job submit`) only starts or attaches to Ray, places
the learner actor (`cluster.learner`) and waits for it. The learner actor runs the local run's whole loop
(`loop.run_learner`: set-up, SFT warm start, RL steps, eval, metrics, checkpoints) with a `RayRollouts` as
its `RolloutSource`; `loop._train` does not know which back-end it drives.

Samplers: each sampler actor (`cluster.samplers.count`, with its `num_cpus`/`num_gpus`/custom `resources`)
builds its own copy of the run's parts from the recipe (sampler, reward, environments) and produces a
share of every step: the step's prompts split into contiguous runs of whole groups, part k seeded apart
from the others (part 0 as a whole step, so one actor samples exactly what a local run does).

Weights: one `ray.put` of the learner's tensors per version, then one `load` call per actor carrying that
object reference (never one call per parameter: open-instruct #1535). An actor runs its calls in order, so
every step submitted after a publish is sampled with it, and the staleness bound and version accounting
are the local async mode's (admission is the loop's).

Reward workers (`cluster.reward_workers.count` > 0): reward-worker actors score for every sampler actor
(its `RewardScorer` is replaced by `RemoteRewards`, which splits the rollouts over them), so slow
verifiers and judges scale apart from sampling. Each role's actors are placed by a PACK placement group,
and a cluster that cannot place them is one line naming the request and what is available.

Faults: a sampler or reward-worker actor that dies (its process killed, its node lost) is restarted by Ray
(`max_restarts`); a sampler's share of the step is produced again by the new incarnation after the current
weights are sent to it, a reward worker's rollouts are scored again, and `faults/actor_restarts` counts
both; an error inside producing is retried like a local one (`trainer.producer_retries`). The learner is
not restarted: its death ends the run with one line naming the last checkpoint (written atomically, so
intact), from which `hone train --resume` goes on. The samplers and reward workers are the learner's
actors and their placement groups the learner's: Ray removes them with it, so a killed learner leaves
nothing behind; Ctrl-C or SIGTERM in the driver kills the learner, and shuts Ray down when this run
started it (an attached cluster is left running).

Files: every actor works in the driver's directory when its node has it, so relative paths in a recipe
(run.dir, model.path, data files) mean the same as locally; on a multi-node cluster the run directory
must be on storage the learner's node sees (the driver reads it only for the one line after a stop).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from hone.config import HoneConfig
from hone.data.splits import load_data
from hone.envs import make_env as _make_env
from hone.errors import HoneError
from hone.orchestration.components import RunComponents, build_components, weight_source
from hone.orchestration.loop import RunInterrupted, RunResult, where_stopped
from hone.orchestration.producer import Producer, PromptBatch, ScoredGroups
from hone.orchestration.rollouts import ProducerError
from hone.rewards.resolve import load_reward
from hone.types import Rollout, Sample

log = logging.getLogger("hone")

# How long one share of a step may take before the run stops with a line instead of waiting forever.
_TAKE_TIMEOUT_S = 3600.0
# How long a killed learner may take to be gone (its actors with it) before the driver stops waiting.
_KILL_TIMEOUT_S = 60.0


class RayClusterError(HoneError, RuntimeError):
    """The cluster could not host the actors the recipe asks for, or the learner died; one line."""


def _enter(cwd: str, threads: int) -> None:
    """An actor's start: the driver's directory (when this node has it) and its torch threads."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format="hone: %(message)s")
    # As `hone.cli` does for a local run: an attached cluster's workers do not have the driver's environment.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _threads(num_cpus: float) -> int:
    return max(1, int(num_cpus))


def _bundle(num_cpus: float, num_gpus: float, resources: dict[str, float]) -> dict[str, float]:
    return {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {}), **resources}


def place(
    cls: type, count: int, bundle: dict[str, float], role: str, timeout: float, *args: Any, restarts: int = -1
) -> tuple[list[Any], Any]:
    """`count` actors of `cls`, one per bundle of a PACK placement group (a role's actors land together),
    and the group; a cluster that cannot host them within `timeout` seconds is one line (and nothing of
    this call is left)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([dict(bundle)] * count, strategy="PACK")
    remote = ray.remote(cls)
    actors: list[Any] = []
    try:
        try:
            ray.get(group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            available = {k: v for k, v in ray.available_resources().items() if not k.startswith("node:")}
            raise RayClusterError(
                f"the Ray cluster cannot place {count} {role}(s) of {bundle} each within {timeout:g} s "
                f"(cluster.start_timeout_s); available: {available}"
            ) from None
        actors = [
            remote.options(
                num_cpus=bundle.get("CPU", 1),
                num_gpus=bundle.get("GPU", 0),
                resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
                max_restarts=restarts,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=k),
            ).remote(*args)
            for k in range(count)
        ]
        try:
            ray.get([a.pid.remote() for a in actors], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RayClusterError(
                f"{count} {role}(s) were placed but did not start within {timeout:g} s "
                "(cluster.start_timeout_s; a worker imports torch and builds the run's parts first)"
            ) from None
    except BaseException:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):
            remove_placement_group(group)
        raise
    return actors, group


def _await_restart(actor: Any, role: str, timeout: float) -> None:
    """Wait until Ray has a died actor back (calls made before it is would fail again)."""
    import ray

    deadline = time.monotonic() + timeout
    while True:
        try:
            ray.get(actor.pid.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise RayClusterError(
                    f"{role} died and was not restarted within {timeout:g} s (cluster.start_timeout_s)"
                ) from None
            time.sleep(0.5)


def _local_cpus(cfg: HoneConfig) -> int:
    """Logical CPUs for a Ray instance this run starts: the machine's, or what the recipe's roles reserve
    if more (on a laptop the roles then share its cores, as a local run's threads do)."""
    c = cfg.cluster
    wanted = c.learner.num_cpus + c.samplers.count * c.samplers.num_cpus
    wanted += c.reward_workers.count * c.reward_workers.num_cpus
    return max(os.cpu_count() or 1, math.ceil(wanted))


class LearnerActor:
    """The learner: the local run's loop (`loop.run_learner`) in an actor placed by `cluster.learner`."""

    def __init__(self, cwd: str, threads: int) -> None:
        _enter(cwd, threads)

    def __repr__(self) -> str:  # Ray prefixes the lines it forwards to the driver with this
        return "learner"

    def pid(self) -> int:
        return os.getpid()

    def train(self, cfg: dict[str, Any], resume: bool) -> RunResult:
        from hone.orchestration.loop import run_learner

        return run_learner(HoneConfig.model_validate(cfg), resume=resume)


def train_on_ray(cfg: HoneConfig, *, resume: bool = False) -> RunResult:
    """The driver's part of a Ray run: attach to `cluster.address` (or `RAY_ADDRESS`) or start a local
    Ray, place the learner actor, wait for its result; a Ray instance this started is shut down at the end,
    whatever the end."""
    import ray

    address = cfg.cluster.address or os.environ.get("RAY_ADDRESS")
    started = False
    if not ray.is_initialized():
        if address:
            _check_reachable(address)
            try:
                ray.init(address=address)
            except (ConnectionError, RuntimeError) as e:
                raise RayClusterError(
                    f"cannot attach to the Ray cluster at {address} (cluster.address or RAY_ADDRESS): "
                    f"{' '.join(str(e).split())[:200]}; a cluster with token authentication (the default "
                    "of `ray start` since Ray 2.5x) also needs RAY_AUTH_MODE=token here, with its token in "
                    "~/.ray/auth_token or RAY_AUTH_TOKEN"
                ) from None
        else:
            ray.init(include_dashboard=False, num_cpus=_local_cpus(cfg))
            started = True
    learner: Any = None
    group: Any = None
    try:
        role = cfg.cluster.learner
        [learner], group = place(
            LearnerActor,
            1,
            _bundle(role.num_cpus, role.num_gpus, role.resources),
            "learner",
            cfg.cluster.start_timeout_s,
            os.getcwd(),
            cfg.run.threads or _threads(role.num_cpus),
            restarts=0,
        )
        run = learner.train.remote(cfg.model_dump(mode="json"), resume)
        try:
            while not ray.wait([run], timeout=1.0)[0]:  # short waits: Ctrl-C lands between them
                pass
            return ray.get(run)
        except ray.exceptions.RayTaskError as e:  # the learner raised: the same error as a local run's
            raise e.cause from e
        except ray.exceptions.RayActorError:
            raise RayClusterError(f"the learner actor died {_stopped(cfg)}") from None
        except KeyboardInterrupt:
            _kill(learner, run)
            learner = None
            raise RunInterrupted(f"interrupted {_stopped(cfg)}") from None
    finally:
        if learner is not None:
            _kill(learner, None)
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(group)
        if started:
            ray.shutdown()


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """A `host:port` that takes no TCP connection is one line at once: `ray.init` would retry it for
    minutes. (`auto` and `ray://` addresses are left to Ray.)"""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise RayClusterError(
            f"cannot attach to the Ray cluster at {address} (cluster.address or RAY_ADDRESS): {e}"
        ) from None


def _kill(learner: Any, run: Any) -> None:
    """Kill the learner (its samplers, reward workers and their placement groups go with it) and wait
    until it is gone."""
    import ray

    with contextlib.suppress(Exception):
        ray.kill(learner, no_restart=True)
    if run is not None:
        with contextlib.suppress(Exception):
            ray.wait([run], timeout=_KILL_TIMEOUT_S)


def _stopped(cfg: HoneConfig) -> str:
    run_dir = Path(cfg.run.dir) / cfg.run.name
    if run_dir.is_dir():
        return where_stopped(run_dir)
    return f"(its run directory {run_dir} is on the learner's node); resume with `hone train --resume`"


class RewardActor:
    """A reward worker: the run's reward built from the recipe, scoring what sampler actors send it."""

    def __init__(self, cfg: dict[str, Any], cwd: str, threads: int) -> None:
        _enter(cwd, threads)
        config = HoneConfig.model_validate(cfg)
        make_env = _make_env(config.env.name, config.env.args) if config.env.name else None
        task, _, _ = load_data(
            config.data,
            eval_size=config.eval.size,
            seed=config.run.seed,
            make_env=make_env,
            env_args=config.env.args,
        )
        self.scorer = load_reward(config.reward, task)

    def __repr__(self) -> str:
        return "reward-worker"

    def pid(self) -> int:
        return os.getpid()

    def score(
        self, rollouts: list[Rollout], samples_by_id: dict[str, Sample]
    ) -> tuple[list[Rollout], dict[str, float]]:
        metrics = self.scorer.score(rollouts, samples_by_id)
        return rollouts, metrics


class RemoteRewards:
    """Stands in for the sampler actor's `RewardScorer`: splits the rollouts over the reward workers and
    writes their grades back in place; the outage bookkeeping stays the local scorer's. A worker that
    died is waited for (Ray restarts it) and its rollouts scored again, counted in `faults/actor_restarts`."""

    def __init__(self, workers: list[Any], local: Any, timeout: float) -> None:
        import ray

        self._ray, self.workers, self.outage, self.correctness = ray, workers, local.outage, local.correctness
        self.timeout = timeout

    def score(self, rollouts: list[Rollout], samples_by_id: dict[str, Sample]) -> dict[str, float]:
        ray, count = self._ray, len(self.workers)
        chunks = [(k, rollouts[k::count]) for k in range(count) if rollouts[k::count]]

        def send(k: int, chunk: list[Rollout]) -> Any:
            samples = {r.sample_id: samples_by_id[r.sample_id] for r in chunk}
            return self.workers[k].score.remote(chunk, samples)

        refs = {k: send(k, chunk) for k, chunk in chunks}  # all in flight at once
        metrics: dict[str, float] = {"faults/actor_restarts": 0.0}
        for k, chunk in chunks:
            while True:
                try:
                    scored, part = ray.get(refs[k], timeout=_TAKE_TIMEOUT_S)
                    break
                except ray.exceptions.RayActorError:
                    metrics["faults/actor_restarts"] += 1
                    log.warning("reward worker %d died; restarted, scoring its rollouts again", k)
                    _await_restart(self.workers[k], f"reward worker {k}", self.timeout)
                    refs[k] = send(k, chunk)
                except ray.exceptions.RayTaskError as e:  # the reward raised: as if it had run here
                    raise e.cause from e
                except ray.exceptions.GetTimeoutError:
                    raise RayClusterError(
                        f"reward worker {k} scored nothing within {_TAKE_TIMEOUT_S:g} s"
                    ) from None
            for mine, theirs in zip(chunk, scored, strict=True):
                mine.reward, mine.reward_parts = theirs.reward, theirs.reward_parts
                mine.metrics.update(theirs.metrics)
            for key, value in part.items():  # counts add up, means are weighted by the chunk's size
                share = 1.0 if key in ("reward/errors", "reward/timeouts") else len(chunk) / len(rollouts)
                metrics[key] = metrics.get(key, 0.0) + value * share
        return metrics


class ProducerActor:
    """A producer in its own process: the run's parts built from the recipe, loaded weights, `produce`;
    scoring on reward workers when the recipe has them."""

    def __init__(self, cfg: dict[str, Any], cwd: str, threads: int, reward_workers: list[Any]) -> None:
        _enter(cwd, threads)
        self.cfg = HoneConfig.model_validate(cfg)
        self.parts = build_components(self.cfg)
        if reward_workers:
            remote = RemoteRewards(reward_workers, self.parts.reward, self.cfg.cluster.start_timeout_s)
            self.parts = replace(self.parts, reward=remote)
        self.producer = Producer(self.parts, self.cfg)

    def __repr__(self) -> str:
        return "sampler"

    def pid(self) -> int:
        return os.getpid()

    def load(self, version: int, tensors: dict[str, torch.Tensor]) -> int:
        self.parts.sampler.load_weights(tensors, version)
        return version

    def produce(self, prompts: PromptBatch) -> ScoredGroups:
        return self.producer.produce(prompts)


@dataclass
class _Share:
    actor: int
    prompts: PromptBatch
    ref: Any
    version: int  # the weights published before it was submitted: it must be sampled with them or newer


class RayRollouts:
    """`RolloutSource` on Ray sampler actors, created by the learner actor (see the module docstring)."""

    def __init__(self, cfg: HoneConfig, parts: RunComponents, *, retries: int = 0) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RayRollouts runs in the learner actor (`ray_backend.train_on_ray`)")
        self._ray = ray
        self.cfg, self.parts, self.retries = cfg, parts, retries
        self.restarts = 0
        self._groups: list[Any] = []
        self._actors: list[Any] = []
        self._reward_workers: list[Any] = []
        role, scoring = cfg.cluster.samplers, cfg.cluster.reward_workers
        config, cwd, timeout = cfg.model_dump(mode="json"), os.getcwd(), cfg.cluster.start_timeout_s
        try:
            if scoring.count:
                self._reward_workers, group = place(
                    RewardActor,
                    scoring.count,
                    _bundle(scoring.num_cpus, 0, scoring.resources),
                    "reward worker",
                    timeout,
                    config,
                    cwd,
                    _threads(scoring.num_cpus),
                )
                self._groups.append(group)
            self._actors, group = place(
                ProducerActor,
                role.count,
                _bundle(role.num_cpus, role.num_gpus, role.resources),
                "sampler actor",
                timeout,
                config,
                cwd,
                _threads(role.num_cpus),
                self._reward_workers,
            )
            self._groups.append(group)
        except BaseException:
            self.close()
            raise
        self._pending: deque[list[_Share]] = deque()
        self._weights: tuple[int, Any] | None = None
        self.publish(parts.weights.published)

    def publish(self, version: int) -> None:
        """One object-store put of this version's tensors; each actor loads it before its next share."""
        ref = self._ray.put(weight_source(self.cfg, self.parts.policy)())  # put copies: no aliasing
        self._weights = (version, ref)
        for actor in self._actors:
            actor.load.remote(version, ref)
        self.parts.weights.publish(version)  # the learner's own sampler, for eval

    def submit(self, prompts: PromptBatch) -> None:
        """Split the step's prompts (whole groups: a sample is a group) into one share per actor."""
        count = len(self._actors)
        size, extra = divmod(len(prompts.samples), count)
        shares, start = [], 0
        for k in range(count):
            end = start + size + (k < extra)
            if end > start:
                share = PromptBatch(step=prompts.step, samples=prompts.samples[start:end], part=k)
                version = self._weights[0] if self._weights is not None else 0
                shares.append(_Share(k, share, self._actors[k].produce.remote(share), version))
            start = end
        self._pending.append(shares)

    def _result(self, share: _Share) -> ScoredGroups:
        """The share's groups, its `faults/producer_retries` counting the attempts that raised."""
        ray = self._ray
        failed = 0
        while True:
            try:
                groups = ray.get(share.ref, timeout=_TAKE_TIMEOUT_S)
                if any(r.policy_version < share.version for r in groups.rollouts):
                    # It died between calls: Ray ran the share on the new incarnation, whose weights are
                    # the model's, not the ones published before the share. Treated as a death in it.
                    raise ray.exceptions.RayActorError()
                groups.metrics["faults/producer_retries"] = float(failed)
                return groups
            except ray.exceptions.RayActorError:
                # The actor's process died; Ray restarts it (fresh parts, version 0 weights): send it the
                # current weights, then its share again.
                self.restarts += 1
                log.warning("sampler actor %d died; restarted, producing its share again", share.actor)
                actor = self._actors[share.actor]
                _await_restart(actor, f"sampler actor {share.actor}", self.cfg.cluster.start_timeout_s)
                if self._weights is not None:
                    actor.load.remote(*self._weights)
                share.ref = actor.produce.remote(share.prompts)
            except ray.exceptions.RayTaskError as e:
                failed += 1
                cause = e.cause
                if failed > self.retries:
                    if isinstance(cause, RayClusterError):  # a reward worker that did not come back
                        raise cause from None
                    error = " ".join(f"{type(cause).__name__}: {cause}".split())
                    raise ProducerError(
                        f"stopped at RL step {share.prompts.step + 1}: producing its rollouts failed on "
                        f"{failed} attempts (trainer.producer_retries={self.retries}); last error: {error}"
                    ) from None
                share.ref = self._actors[share.actor].produce.remote(share.prompts)
            except ray.exceptions.GetTimeoutError:
                raise ProducerError(
                    f"stopped at RL step {share.prompts.step + 1}: sampler actor {share.actor} gave no "
                    f"rollouts within {_TAKE_TIMEOUT_S:g} s"
                ) from None

    def take(self) -> ScoredGroups:
        if not self._pending:
            raise RuntimeError("take() with no prompts submitted")
        shares = self._pending.popleft()
        waited = time.perf_counter()
        restarts = self.restarts
        results = [self._result(share) for share in shares]
        groups = merge_shares([s.prompts for s in shares], results)
        version = self._weights[0] if self._weights is not None else 0
        lags = [version - r.policy_version for r in groups.rollouts] or [0]
        # Reward workers' restarts come summed in the shares' metrics; the samplers' are counted here.
        restarted = groups.metrics.get("faults/actor_restarts", 0.0) + self.restarts - restarts
        groups.metrics |= {
            "staleness/mean": sum(lags) / len(lags),
            "staleness/max": float(max(lags)),
            "time/learner_wait_s": time.perf_counter() - waited,
            "faults/actor_restarts": restarted,
        }
        return groups

    def close(self) -> None:
        """Kill the actors and remove their placement groups (Ray would with the learner; a run that ends
        normally does it at once)."""
        ray = self._ray
        for actor in [*self._actors, *self._reward_workers]:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor, no_restart=True)
        self._actors, self._reward_workers = [], []
        from ray.util.placement_group import remove_placement_group

        for group in self._groups:
            with contextlib.suppress(Exception):
                remove_placement_group(group)
        self._groups = []


def merge_shares(shares: list[PromptBatch], results: list[ScoredGroups]) -> ScoredGroups:
    """One step's `ScoredGroups` from its shares, in prompt order: group ids (positions within a share)
    shifted by the groups before the share; metrics averaged over the shares weighted by their prompts,
    times the slowest share's, fault counts summed; per-prompt outcomes summed (a prompt drawn twice in
    a step may fall in two shares)."""
    rollouts, metrics, offset = [], {}, 0
    outcomes: dict[str, tuple[int, int]] = {}
    total = sum(len(s.samples) for s in shares)
    for share, result in zip(shares, results, strict=True):
        for r in result.rollouts:
            r.group_id += offset
            rollouts.append(r)
        offset += len(share.samples)
        for sample_id, (correct, scored) in result.outcomes.items():
            before = outcomes.get(sample_id, (0, 0))
            outcomes[sample_id] = (before[0] + correct, before[1] + scored)
        for key, value in result.metrics.items():
            if key.startswith("time/"):
                metrics[key] = max(metrics.get(key, 0.0), value)
            elif key.startswith("faults/"):
                metrics[key] = metrics.get(key, 0.0) + value
            else:
                metrics[key] = metrics.get(key, 0.0) + value * len(share.samples) / total
    return ScoredGroups(
        step=shares[0].step,
        rollouts=rollouts,
        metrics=metrics,
        new_tokens=sum(r.new_tokens for r in results),
        outcomes=outcomes,
    )

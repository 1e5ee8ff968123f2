"""The Ray back-end (`cluster.backend: ray`): producers as Ray actors behind the same `RolloutSource`.

Each sampler actor (`cluster.samplers.count`, with its `num_cpus`/`num_gpus`/custom `resources`) builds its
own copy of the run's parts from the recipe (sampler, reward, environments) and produces a share of every
step: the step's prompts split into contiguous runs of whole groups, part k seeded apart from the others
(part 0 as a whole step, so one actor samples exactly what a local run does). The learner stays in the
driver, as in a local run, with its metrics, checkpoints and eval sampler; `loop._train` does not know
which back-end it drives.

Weights: one `ray.put` of the learner's tensors per version, then one `load` call per actor carrying that
object reference (never one call per parameter: open-instruct #1535). An actor runs its calls in order, so
every step submitted after a publish is sampled with it, and the staleness bound and version accounting
are the local async mode's (admission is the loop's).

Faults: an actor that dies (its process killed, its node lost) is restarted by Ray (`max_restarts`); its
share of the step is produced again by the new incarnation after the current weights are sent to it, and
`faults/actor_restarts` counts it; an error inside producing is retried like a local one
(`trainer.producer_retries`). `close` kills the actors, and shuts Ray down when this run started it (an
attached cluster is left running).

Reward workers (`cluster.reward_workers.count` > 0): reward-worker actors score for every sampler
actor (its `RewardScorer` is replaced by `RemoteRewards`, which splits the rollouts over them), so slow
verifiers and judges scale apart from sampling. Each role's actors are placed by a PACK placement group,
and a cluster that cannot place them is one line naming the request and what is available.

Where this departs from issue 17's text: the learner is not an actor; it stays in the driver process
(which `ray job submit` places on the cluster), with the checkpoints, metrics and eval sampler of a
local run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import torch

from hone.config import HoneConfig
from hone.envs import make_env as _make_env
from hone.orchestration.components import (
    RunComponents,
    build_components,
    load_data,
    load_reward,
    weight_source,
)
from hone.orchestration.producer import Producer, PromptBatch, ScoredGroups
from hone.orchestration.rollouts import ProducerError
from hone.types import Rollout, Sample

log = logging.getLogger("hone")

# How long one share of a step may take before the run stops with a line instead of waiting forever.
_TAKE_TIMEOUT_S = 3600.0


class RayClusterError(RuntimeError):
    """The cluster could not host the actors the recipe asks for; the message is one line."""


class RewardActor:
    """A reward worker: the run's reward built from the recipe, scoring what sampler actors send it."""

    def __init__(self, cfg: dict[str, Any], threads: int) -> None:
        torch.set_num_threads(threads)
        config = HoneConfig.model_validate(cfg)
        make_env = _make_env(config.env.name, config.env.args) if config.env.name else None
        task, _, _ = load_data(config, make_env)
        self.scorer = load_reward(config, task)

    def pid(self) -> int:
        return os.getpid()

    def score(
        self, rollouts: list[Rollout], samples_by_id: dict[str, Sample]
    ) -> tuple[list[Rollout], dict[str, float]]:
        metrics = self.scorer.score(rollouts, samples_by_id)
        return rollouts, metrics


class RemoteRewards:
    """Stands in for the sampler actor's `RewardScorer`: splits the rollouts over the reward workers and
    writes their grades back in place; the outage bookkeeping stays the local scorer's."""

    def __init__(self, workers: list[Any], local: Any) -> None:
        import ray

        self._ray, self.workers, self.outage, self.correctness = ray, workers, local.outage, local.correctness

    def score(self, rollouts: list[Rollout], samples_by_id: dict[str, Sample]) -> dict[str, float]:
        count = len(self.workers)
        chunks = [rollouts[k::count] for k in range(count)]
        refs = [
            worker.score.remote(chunk, {r.sample_id: samples_by_id[r.sample_id] for r in chunk})
            for worker, chunk in zip(self.workers, chunks, strict=True)
            if chunk
        ]
        metrics: dict[str, float] = {}
        for chunk, (scored, part) in zip([c for c in chunks if c], self._ray.get(refs), strict=True):
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

    def __init__(self, cfg: dict[str, Any], threads: int, reward_workers: list[Any]) -> None:
        torch.set_num_threads(threads)
        self.cfg = HoneConfig.model_validate(cfg)
        self.parts = build_components(self.cfg)
        if reward_workers:
            self.parts = replace(self.parts, reward=RemoteRewards(reward_workers, self.parts.reward))
        self.producer = Producer(self.parts, self.cfg)

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

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


class RayRollouts:
    """`RolloutSource` on Ray sampler actors (see the module docstring)."""

    def __init__(self, cfg: HoneConfig, parts: RunComponents, *, retries: int = 0) -> None:
        import ray

        self._ray = ray
        self.cfg, self.parts, self.retries = cfg, parts, retries
        self.restarts = 0
        address = cfg.cluster.address or os.environ.get("RAY_ADDRESS")
        self._started = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(include_dashboard=False, log_to_driver=False)
                self._started = True
        role, scoring = cfg.cluster.samplers, cfg.cluster.reward_workers
        config = cfg.model_dump(mode="json")
        self._groups: list[Any] = []
        self._reward_workers = self._start(
            RewardActor,
            scoring.count,
            {"CPU": scoring.num_cpus, **scoring.resources},
            "reward worker",
            config,
            max(1, int(scoring.num_cpus)),
        )
        bundle = {"CPU": role.num_cpus, **({"GPU": role.num_gpus} if role.num_gpus else {}), **role.resources}
        self._actors = self._start(
            ProducerActor,
            role.count,
            bundle,
            "sampler actor",
            config,
            max(1, int(role.num_cpus)),
            self._reward_workers,
        )
        self._pending: deque[list[_Share]] = deque()
        self._weights: tuple[int, Any] | None = None
        self.publish(parts.weights.published)

    def _start(self, cls: type, count: int, bundle: dict[str, float], role: str, *args: Any) -> list[Any]:
        """`count` actors of `cls`, one per bundle of a PACK placement group (a role's actors land
        together); a cluster that cannot host them within `cluster.start_timeout_s` is one line."""
        ray = self._ray
        if count == 0:
            return []
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        timeout = self.cfg.cluster.start_timeout_s
        group = placement_group([dict(bundle)] * count, strategy="PACK")
        self._groups.append(group)
        try:
            ray.get(group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            available = {k: v for k, v in ray.available_resources().items() if not k.startswith("node:")}
            self.close()
            raise RayClusterError(
                f"the Ray cluster cannot place {count} {role}(s) of {bundle} each within {timeout:g} s "
                f"(cluster.start_timeout_s); available: {available}"
            ) from None
        remote = ray.remote(cls)
        actors = [
            remote.options(
                num_cpus=bundle.get("CPU", 1),
                num_gpus=bundle.get("GPU", 0),
                resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
                max_restarts=-1,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=k),
            ).remote(*args)
            for k in range(count)
        ]
        try:
            ray.get([a.pid.remote() for a in actors], timeout=timeout)
        except BaseException:
            self._actors = actors
            self.close()
            raise
        return actors

    def publish(self, version: int) -> None:
        """One object-store put of this version's tensors; each actor loads it before its next share."""
        ref = self._ray.put(weight_source(self.cfg, self.parts.policy)())  # put copies: no aliasing
        self._weights = (version, ref)
        for actor in self._actors:
            actor.load.remote(version, ref)
        self.parts.weights.publish(version)  # the driver's own sampler, for eval

    def submit(self, prompts: PromptBatch) -> None:
        """Split the step's prompts (whole groups: a sample is a group) into one share per actor."""
        count = len(self._actors)
        size, extra = divmod(len(prompts.samples), count)
        shares, start = [], 0
        for k in range(count):
            end = start + size + (k < extra)
            if end > start:
                share = PromptBatch(step=prompts.step, samples=prompts.samples[start:end], part=k)
                shares.append(_Share(k, share, self._actors[k].produce.remote(share)))
            start = end
        self._pending.append(shares)

    def _result(self, share: _Share) -> ScoredGroups:
        """The share's groups, its `faults/producer_retries` counting the attempts that raised."""
        ray = self._ray
        failed = 0
        while True:
            try:
                groups = ray.get(share.ref, timeout=_TAKE_TIMEOUT_S)
                groups.metrics["faults/producer_retries"] = float(failed)
                return groups
            except ray.exceptions.RayActorError:
                # The actor's process died; Ray restarts it (fresh parts, version 0 weights): send it the
                # current weights, then its share again.
                self.restarts += 1
                log.warning("sampler actor %d died; restarted, producing its share again", share.actor)
                actor = self._actors[share.actor]
                self._await_restart(share.actor)
                if self._weights is not None:
                    actor.load.remote(*self._weights)
                share.ref = actor.produce.remote(share.prompts)
            except ray.exceptions.RayTaskError as e:
                failed += 1
                cause = e.as_instanceof_cause()
                if failed > self.retries:
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

    def _await_restart(self, index: int) -> None:
        """Wait until Ray has the actor back (calls made before it is would fail again)."""
        ray, timeout = self._ray, self.cfg.cluster.start_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            try:
                ray.get(self._actors[index].pid.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise RayClusterError(
                        f"sampler actor {index} died and was not restarted within {timeout:g} s "
                        "(cluster.start_timeout_s)"
                    ) from None
                time.sleep(0.5)

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
        groups.metrics |= {
            "staleness/mean": sum(lags) / len(lags),
            "staleness/max": float(max(lags)),
            "time/learner_wait_s": time.perf_counter() - waited,
            "faults/actor_restarts": float(self.restarts - restarts),
        }
        return groups

    def actor_pids(self) -> list[int]:
        return self._ray.get([a.pid.remote() for a in self._actors], timeout=60)

    def actor_nodes(self) -> list[str]:
        """The Ray node id each sampler actor runs on."""
        return self._ray.get([a.node.remote() for a in self._actors], timeout=60)

    def close(self) -> None:
        """Kill the actors; shut Ray down if this run started it."""
        ray = self._ray
        for actor in [*getattr(self, "_actors", []), *getattr(self, "_reward_workers", [])]:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor, no_restart=True)
        self._actors, self._reward_workers = [], []
        from ray.util.placement_group import remove_placement_group

        for group in getattr(self, "_groups", []):
            with contextlib.suppress(Exception):
                remove_placement_group(group)
        self._groups = []
        if self._started and ray.is_initialized():
            ray.shutdown()
            self._started = False


def merge_shares(shares: list[PromptBatch], results: list[ScoredGroups]) -> ScoredGroups:
    """One step's `ScoredGroups` from its shares, in prompt order: group ids (positions within a share)
    shifted by the groups before the share; metrics averaged over the shares weighted by their prompts,
    times the slowest share's, fault counts summed."""
    rollouts, metrics, offset = [], {}, 0
    total = sum(len(s.samples) for s in shares)
    for share, result in zip(shares, results, strict=True):
        for r in result.rollouts:
            r.group_id += offset
            rollouts.append(r)
        offset += len(share.samples)
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
    )

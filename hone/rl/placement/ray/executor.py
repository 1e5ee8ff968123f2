"""The Ray executor (`cluster.backend: ray`): the rollout source's producers as Ray sampler actors.

The driver stays the controller: it runs the loop and the learner (`loop.run_learner`, as locally) inside
`ray_cluster.ray_session`, and only the roles are actors: `cluster.samplers.count` sampler actors
(`ray_actors.SamplerActor`, each an engine) and `cluster.reward_workers.count` reward workers
(`ray_actors.RewardActor`), each role placed by its own PACK placement group (`ray_cluster.place`).

Weights: one `ray.put` of the learner's tensors per version, then one `load` call per actor carrying that
object reference (never one call per parameter: open-instruct #1535). An actor runs its calls in order,
so every share submitted after a publish is sampled with it, and the staleness bound and version
accounting are the rollout source's, as for the thread executor.

Verification (`trainer.verify_weights`): each actor's `load` returns the version its engine then holds
and the fingerprint of the weights it holds; the driver computes the fingerprint of what it put (in
the engine's dtype and grouping, learned from the first load at set-up) and compares them as each
share's result arrives (an actor runs its calls in order: the loads before a share are done by then),
so a sampler actor that misses a version, or receives it damaged, stops the run in that step.

Faults: a sampler or reward-worker actor that dies (its process killed, its node lost) is restarted by Ray
(`max_restarts`); a sampler's share is produced again by the new incarnation after the current weights
are sent to it, a reward worker's rollouts are scored again, and `faults/actor_restarts` counts both. An
error inside producing is retried in the actor like a local one (`cluster.producer_retries`). The actors
and their placement groups are the driver's: `close` removes them, and Ray removes them with a driver
that dies (a SIGKILL), so a run leaves nothing behind; Ctrl-C and SIGTERM close the run's source as any
error does (`loop._train`), then `ray_session` shuts down a Ray the run started.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from hone.config import ClusterConfig, HoneConfig
from hone.plugins import script_objects
from hone.rl.components import PlacementParts
from hone.rl.placement.ray.actors import CALL_TIMEOUT_S, RewardActor, SamplerActor
from hone.rl.placement.ray.cluster import await_restart, bundle, place, remove
from hone.rl.placement.source import ProducerError
from hone.rl.placement.weights import WeightChannel
from hone.rl.producer import PromptBatch, ScoredGroups
from hone.rl.replay import ReplayBuffer
from hone.rollout.fingerprint import Fingerprint, WeightMismatchError, compare, expected_for

log = logging.getLogger("hone")

# How long one wait inside `result` lasts: Ctrl-C reaches the driver between waits.
_WAIT_S = 1.0


def _threads(num_cpus: float) -> int:
    return max(1, int(num_cpus))


class _Share:
    """One share on sampler actor `k`, submitted when the producers' newest version was `version` (it must
    be sampled with that version or a newer one)."""

    def __init__(self, executor: RayExecutor, k: int, prompts: PromptBatch, version: int) -> None:
        self._executor, self.k, self.prompts, self.version = executor, k, prompts, version
        self._ref = executor._produce(k, prompts)
        self._got: ScoredGroups | None = None

    def peek(self) -> ScoredGroups | None:
        import ray

        if self._got is None and ray.wait([self._ref], timeout=0)[0]:
            try:
                groups: ScoredGroups = ray.get(self._ref)
            except Exception:  # `result` handles it when the source takes the step
                return None
            return groups if all(r.policy_version >= self.version for r in groups.rollouts) else None
        return self._got

    def result(self) -> ScoredGroups:
        """The share's groups; `faults/actor_restarts` counts the restarts of its actor it took (its reward
        workers' come counted in its metrics)."""
        import ray

        if self._got is not None:
            return self._got
        restarts = 0
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            try:
                while not ray.wait([self._ref], timeout=_WAIT_S)[0]:
                    if time.monotonic() > deadline:
                        raise ProducerError(
                            f"stopped at RL step {self.prompts.step + 1}: sampler actor {self.k} gave no "
                            f"rollouts within {CALL_TIMEOUT_S:g} s"
                        )
                groups: ScoredGroups = ray.get(self._ref)
                if any(r.policy_version < self.version for r in groups.rollouts):
                    # It died between calls: Ray ran the share on the new incarnation, whose weights are
                    # the model's, not the ones published before the share. Treated as a death in it.
                    raise ray.exceptions.RayActorError()
            except ray.exceptions.RayActorError:
                # The actor's process died; Ray restarts it (its role built again, version-0 weights): send
                # it the current weights, then its share again.
                restarts += 1
                log.warning("sampler actor %d died; restarted, producing its share again", self.k)
                self._ref = self._executor._restarted(self.k, self.prompts)
                continue
            except ray.exceptions.RayTaskError as e:  # raised in the actor, past its retries
                if isinstance(e.cause, BaseException):
                    raise e.cause from None
                raise ProducerError(
                    f"stopped at RL step {self.prompts.step + 1}: {str(e).splitlines()[0]}"
                ) from None
            self._executor.verify_loads()  # the loads before this share are done by now
            before = groups.metrics.get("faults/actor_restarts", 0.0)  # its reward workers' restarts
            groups.metrics["faults/actor_restarts"] = before + restarts
            self._got = groups
            return groups


class RayExecutor:
    """`cluster.samplers.count` sampler actors (and the reward workers they score on), each producing its
    share of every step; see the module docstring. `source` gives the learner's tensors a publish sends
    (`components.weight_source`); `local` is the driver's own sampler's channel (eval samples with it)."""

    inline = False

    def __init__(
        self,
        cluster: ClusterConfig,
        recipe: dict[str, Any],
        source: Callable[[], dict[str, torch.Tensor]],
        local: WeightChannel,
        *,
        retries: int = 0,
        verify: bool = True,
    ) -> None:
        import ray

        self._ray, self._source, self._local, self.retries = ray, source, local, retries
        self._timeout = cluster.start_timeout_s
        self._groups: list[Any] = []
        self._actors: list[Any] = []
        self._reward_workers: list[Any] = []
        samplers, scoring, cwd = cluster.samplers, cluster.reward_workers, os.getcwd()
        objects = script_objects()  # a program's own rewards and environments (hone.trl), pickled by Ray
        try:
            if scoring.count:
                self._reward_workers, group = place(
                    RewardActor,
                    scoring.count,
                    bundle(scoring.num_cpus, 0, scoring.resources),
                    "reward worker",
                    self._timeout,
                    recipe,
                    cwd,
                    _threads(scoring.num_cpus),
                    objects,
                )
                self._groups.append(group)
            self._actors, group = place(
                SamplerActor,
                samplers.count,
                bundle(samplers.num_cpus, samplers.num_gpus, samplers.resources),
                "sampler actor",
                self._timeout,
                recipe,
                cwd,
                _threads(samplers.num_cpus),
                objects,
                self._reward_workers,
            )
            self._groups.append(group)
        except BaseException:
            self.close()
            raise
        self._weights: tuple[int, Any] | None = None
        self._verify = verify
        self._held_like: Fingerprint | None = None  # the engine's dtypes and grouping (first load)
        self._expected: dict[int, Fingerprint] = {}  # each version with loads not yet checked
        self._loads: list[tuple[int, int, Any]] = []  # (version, actor, the load's reference) unchecked
        self.publish(local.published)
        if verify:  # the set-up load, waited for: its report says how each engine holds the weights
            self.verify_loads(wait=True)

    @property
    def width(self) -> int:
        return len(self._actors)

    def _produce(self, k: int, prompts: PromptBatch) -> Any:
        return self._actors[k].produce.remote(prompts, self.retries)

    def _restarted(self, k: int, prompts: PromptBatch) -> Any:
        """Wait for sampler actor `k`'s new incarnation, send it the current weights, then `prompts`."""
        actor = self._actors[k]
        await_restart(actor, f"sampler actor {k}", self._timeout)
        if self._weights is not None:
            self._loads.append((self._weights[0], k, actor.load.remote(*self._weights)))
        return self._produce(k, prompts)

    def submit(self, k: int, prompts: PromptBatch) -> _Share:
        return _Share(self, k, prompts, self._weights[0] if self._weights is not None else 0)

    def publish(self, version: int) -> None:
        """One object-store put of this version's tensors; each actor loads it before its next share."""
        tensors = self._source()
        ref = self._ray.put(tensors)  # put copies: no aliasing
        self._weights = (version, ref)
        if self._verify and self._held_like is not None:
            self._expected[version] = expected_for(tensors, self._held_like)
        for k, actor in enumerate(self._actors):
            load = actor.load.remote(version, ref)
            if self._verify:
                self._loads.append((version, k, load))
        self._local.publish(version)  # the driver's own sampler, for eval

    def verify_loads(self, *, wait: bool = False) -> None:
        """Compare each finished load's report with what was published (`wait`: every load, blocking);
        `WeightMismatchError` names the actor and the version."""
        pending = []
        for version, k, load in self._loads:
            if not wait and not self._ray.wait([load], timeout=0)[0]:
                pending.append((version, k, load))
                continue
            held_version, held = self._ray.get(load, timeout=CALL_TIMEOUT_S)
            where = f"sampler actor {k}"
            if held_version != version:
                raise WeightMismatchError(
                    f"{where} reports weight version {held_version} after loading version {version}"
                )
            if held is None:
                continue
            if self._held_like is None:  # the set-up load: what the learner holds now is what it put
                self._held_like = held
                self._expected[version] = expected_for(self._source(), held)
            problem = compare(self._expected[version], held)
            if problem is not None:
                raise WeightMismatchError(
                    f"weight version {version} on {where} is not what the learner published: {problem}"
                )
        self._loads = pending
        waiting = {version for version, _, _ in pending} | {self._weights[0] if self._weights else -1}
        self._expected = {v: f for v, f in self._expected.items() if v in waiting}

    def idle_s(self) -> float | None:
        return None  # an actor's idle time is not measured from the driver

    def close(self) -> None:
        """Kill the actors and remove their placement groups."""
        remove([*self._actors, *self._reward_workers], self._groups)
        self._actors, self._reward_workers, self._groups = [], [], []


def ray_executor(cfg: HoneConfig, parts: PlacementParts, replay: ReplayBuffer | None) -> RayExecutor:
    """`cluster.backend: ray` (`backends`): the run's producers as sampler actors, fed the weights of the
    driver's channel. `replay` is always None here: the config refuses a replay buffer on Ray."""
    return RayExecutor(
        cfg.cluster,
        cfg.model_dump(mode="json"),
        parts.weight_source,
        parts.weights,
        retries=cfg.cluster.producer_retries,
        verify=cfg.trainer.verify_weights,
    )

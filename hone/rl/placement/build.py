"""Where the run's producers run: the one rollout source over the executor the recipe places them on.

    cluster.mode: sync                       InlineExecutor(producer)             η = 0
    cluster.mode: async, cluster.producers k  ThreadExecutor(k producers)          η = cluster.max_staleness
    cluster.backend: ray                     RayExecutor(cluster.samplers.count)  η as the mode says

The driver process always runs the loop and the learner; only the executor changes (see `rollouts`), made
by the factory `cluster.backend` is registered with (`backends`).
"""

from __future__ import annotations

from collections.abc import Callable

from hone.config import HoneConfig
from hone.plugins import load_object
from hone.rl.components import PlacementParts, close_samplers, producer_replica
from hone.rl.placement.backends import BACKENDS
from hone.rl.placement.executors import InlineExecutor, ThreadExecutor
from hone.rl.placement.source import Executor, PromptPlan, Rollouts
from hone.rl.placement.staleness import StalenessController
from hone.rl.producer import Producer, ProducerSettings
from hone.rl.replay import ReplayBuffer

# What a backend's registry line names (`backends.register_backend`).
ExecutorFactory = Callable[[HoneConfig, PlacementParts, ReplayBuffer | None], Executor]


def executor(cfg: HoneConfig, parts: PlacementParts, replay: ReplayBuffer | None = None) -> Executor:
    """The executor the recipe's `cluster.backend` builds (`backends.BACKENDS`). `replay` goes to the
    first producer (the config allows it only with one producer of a backend that declares it)."""
    entry = BACKENDS[cfg.cluster.backend]
    factory: ExecutorFactory = load_object(entry.executor, what=f"cluster.backend {cfg.cluster.backend!r}")
    return factory(cfg, parts, replay)


def local_executor(cfg: HoneConfig, parts: PlacementParts, replay: ReplayBuffer | None) -> Executor:
    """`cluster.backend: local`: the run's producer inline (sync), or `cluster.producers` producers on
    threads (async), each but the first over a replica of the run's sampler."""
    retries = cfg.cluster.producer_retries
    settings = ProducerSettings.of(cfg)
    producer = Producer(parts.producer, settings, replay)
    if cfg.cluster.mode == "async":
        replicas = [producer_replica(cfg, parts) for _ in range(cfg.cluster.producers - 1)]
        return ThreadExecutor(
            [(producer, parts.weights), *((Producer(r, settings), weights) for r, weights in replicas)],
            retries=retries,
            on_close=lambda: close_samplers(*(r for r, _ in replicas)),
        )
    return InlineExecutor(producer, parts.weights, retries=retries)


def staleness_start(cfg: HoneConfig) -> int:
    """The η an asynchronous run admits at first: `cluster.max_staleness`, or `auto`'s start (capped)."""
    limit = cfg.cluster.max_staleness
    return StalenessController(cfg.cluster.max_staleness_cap).limit if limit == "auto" else limit


def rollout_source(
    cfg: HoneConfig,
    parts: PlacementParts,
    plan: PromptPlan,
    *,
    start: int,
    replay: ReplayBuffer | None = None,
) -> Rollouts:
    """The run's rollout source from step `start` (a resumed run's), at the weight version `parts.weights`
    holds: admission η = `cluster.max_staleness` when asynchronous, 0 when synchronous."""
    ahead = staleness_start(cfg) if cfg.cluster.mode == "async" else 0
    return Rollouts(
        executor(cfg, parts, replay),
        plan,
        start=start,
        steps=cfg.run.steps,
        ahead=ahead,
        version=parts.weights.published,
        whole_steps=cfg.cluster.producer_split == "steps",
    )

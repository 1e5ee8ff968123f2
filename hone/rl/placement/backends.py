"""The placements a run's producers can run on (`cluster.backend`), by name, each with what it supports.

A backend is an executor factory, `pkg.mod:fn(cfg, parts, replay) -> Executor` (`hone.rl.placement.build`
calls it), and what it declares (`BackendCapabilities`). The factory is imported only when a run builds
it (ray: an optional extra); validating a recipe reads the declarations alone, so this module imports
nothing but the registry: the recipe checks (`hone.rl.recipe_checks`) check `cluster.backend` and the
keys only some placements honour (`rollout.interruptible`, `algorithm.replay`, `rollout.agent`) without
loading ray or any run code.
A new backend is its executor module plus one `register_backend` line here (or in a plugin).
"""

from __future__ import annotations

from dataclasses import dataclass

from hone.registry import Registry


@dataclass(frozen=True)
class BackendCapabilities:
    """What a placement can do beyond producing rollouts; off unless declared."""

    # It can run a step's whole production in one producer in the driver's process, in order
    # (`cluster.producers: 1`): what a replay buffer (`algorithm.replay`) and the agent endpoint serving the
    # run's one sampler (`rollout.agent`) need.
    single_producer: bool = False
    # Its samplers share the learner's process, so a publish can land between two of their tokens
    # (`rollout.interruptible`); actors elsewhere take weights between shares.
    interruptible: bool = False


@dataclass(frozen=True)
class RegisteredBackend:
    """A registry line: where the executor factory is (`pkg.mod:fn`) and what the placement declares."""

    executor: str
    capabilities: BackendCapabilities


BACKENDS: Registry[RegisteredBackend] = Registry("backend")


def register_backend(name: str, executor: str, capabilities: BackendCapabilities) -> None:
    """Make `cluster.backend: name` place producers with the factory at `executor` (`pkg.mod:fn`)."""
    BACKENDS.add(name, RegisteredBackend(executor, capabilities))


# The driver's own process: one producer inline (sync) or `cluster.producers` threads (async).
register_backend(
    "local",
    "hone.rl.placement.build:local_executor",
    BackendCapabilities(single_producer=True, interruptible=True),
)
# `cluster.samplers.count` Ray sampler actors (the `ray` extra); the learner stays in the driver.
register_backend("ray", "hone.rl.placement.ray.executor:ray_executor", BackendCapabilities())

"""The checks of a language-model recipe that ask the registries (`hone.config.checks`): the config is a
leaf and cannot import them, so `hone/__init__.py` registers `check_language_model_recipe` by its path and
`load_config` calls it on every recipe it has validated, before anything is written.

Each check raises `ConfigError` with one line naming the key. It is registered for language-model recipes
only, so loading a control recipe never imports this module (nor torch); it returns at once if handed one
all the same. The checks run in the recipe's order (rollout, algorithm,
dpo, cluster, then the rules across sections), so a recipe with several errors reports the first it
spells."""

from __future__ import annotations

from typing import Any

from hone.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    OFF_POLICY_CORRECTIONS,
    POLICY_LOSSES,
    PREFERENCE_LOSSES,
)
from hone.algorithms.advantages import hyperparameter_choices, hyperparameters, reads_values
from hone.config import AlgorithmConfig, ConfigError, HoneConfig
from hone.registry import Registry
from hone.rl.placement.backends import BACKENDS
from hone.rollout.engines import ENGINES, engine_capabilities


def check_language_model_recipe(cfg: HoneConfig) -> None:
    """Every registry name and declared capability a language-model recipe relies on."""
    if cfg.control is not None:  # a control run reads none of these sections (the schema refuses them)
        return
    _check_rollout(cfg)
    _check_algorithm(cfg.algorithm)
    _registered("dpo.loss", cfg.dpo.loss, PREFERENCE_LOSSES)
    _registered("cluster.backend", cfg.cluster.backend, BACKENDS)
    _check_critic(cfg)
    _check_placement(cfg)


def _registered(key: str, name: str, registry: Registry[Any]) -> None:
    if name not in registry:
        raise ConfigError(f"{key}: {registry.unknown(name)}")


def _declaring(registry: Registry[Any], capability: str) -> str:
    """The names registered with `capability` declared (an engine's or a backend's), for an error line."""
    return " | ".join(sorted(n for n, e in registry.items() if getattr(e.capabilities, capability)))


def _check_rollout(cfg: HoneConfig) -> None:
    rollout = cfg.rollout
    _registered("rollout.engine", rollout.engine, ENGINES)
    if rollout.dtype != "model" and not engine_capabilities(rollout.engine).dtype_override:
        raise ConfigError(
            f"rollout.dtype: {rollout.dtype} needs an engine that casts its weights "
            f"({_declaring(ENGINES, 'dtype_override')}); the {rollout.engine} engine samples in model.dtype"
        )


def _check_algorithm(algorithm: AlgorithmConfig) -> None:
    _registered("algorithm.advantage", algorithm.advantage, ADVANTAGE_ESTIMATORS)
    _check_advantage_args(algorithm.advantage, algorithm.advantage_args)
    std_over = algorithm.advantage_args.get("std_over", "group")
    if algorithm.advantage == "grpo" and not algorithm.norm_by_std and std_over != "group":
        # grpo divides by no std at all then: the batch std asked for would silently not apply
        raise ConfigError("algorithm.advantage_args.std_over: batch needs algorithm.norm_by_std: true")
    _registered("algorithm.policy_loss", algorithm.policy_loss, POLICY_LOSSES)
    agg = algorithm.loss_agg
    if agg is not None and agg not in AGGREGATION_MODES:
        modes = ", ".join(AGGREGATION_MODES)
        raise ConfigError(f"algorithm.loss_agg: unknown loss aggregation {agg!r}; choose one of {modes}")
    _registered("algorithm.kl.estimator", algorithm.kl.estimator, KL_ESTIMATORS)
    _registered("algorithm.off_policy.name", algorithm.off_policy.name, OFF_POLICY_CORRECTIONS)


def _check_advantage_args(advantage: str, args: dict[str, Any]) -> None:
    """`algorithm.advantage_args` against the estimator's signature: one place per value, so a
    hyperparameter this section has a key for is set by that key."""
    declared = hyperparameters(advantage)
    fields = AlgorithmConfig.model_fields.keys()
    keyed = sorted(declared & fields)
    own = sorted(declared - fields)
    for key in args:
        if key in keyed:
            raise ConfigError(
                f"algorithm.advantage_args: {key!r} is algorithm.{key}: set it there (one key per value)"
            )
        if key not in declared:
            also = f" ({', '.join(keyed)}: algorithm keys)" if keyed else ""
            raise ConfigError(
                f"algorithm.advantage_args: advantage estimator {advantage!r} has no hyperparameter {key!r}; "
                f"it accepts {', '.join(own) or 'none'}{also}"
            )
    for key, choices in hyperparameter_choices(advantage).items():
        if key in args and args[key] not in choices:
            raise ConfigError(
                f"algorithm.advantage_args.{key}: {args[key]!r} is not one of "
                f"{', '.join(map(str, choices))} (advantage estimator {advantage!r})"
            )


def _check_critic(cfg: HoneConfig) -> None:
    # An estimator that reads the critic's values (GAE: its advantages are the critic's TD errors) needs
    # one, and a critic no estimator reads would only cost a model.
    advantage = cfg.algorithm.advantage
    if reads_values(advantage) != (cfg.critic is not None):
        raise ConfigError(
            f"algorithm.advantage: {advantage} needs a critic section (critic: {{}} for its defaults)"
            if cfg.critic is None
            else f"critic: set only with an estimator that reads values (gae), not {advantage!r}"
        )


def _check_placement(cfg: HoneConfig) -> None:
    # The engine's samplers and the placement must both declare that a publish can land between two
    # tokens (`EngineCapabilities`, `BackendCapabilities`); others take weights between shares.
    backend = BACKENDS[cfg.cluster.backend].capabilities
    if cfg.rollout.interruptible and (
        cfg.cluster.mode != "async"
        or not engine_capabilities(cfg.rollout.engine).interruptible
        or not backend.interruptible
    ):
        engines, backends = _declaring(ENGINES, "interruptible"), _declaring(BACKENDS, "interruptible")
        raise ConfigError(
            f"rollout.interruptible needs cluster.mode: async, rollout.engine: {engines} and "
            f"cluster.backend: {backends} (a synchronous run publishes between steps; other engines and "
            "placements take weights between shares)"
        )
    # The replay buffer lives in the one producer that samples every step in order, and the agent endpoint
    # serves the run's one sampler: producers side by side (threads or Ray actors) each see their own.
    one_producer = cfg.cluster.producers == 1 and backend.single_producer
    for key, on in (("algorithm.replay", cfg.algorithm.replay.enabled), ("rollout.agent", cfg.rollout.agent)):
        if on and not one_producer:
            raise ConfigError(
                f"{key} needs one local producer (cluster.producers: 1, cluster.backend: "
                f"{_declaring(BACKENDS, 'single_producer')})"
            )

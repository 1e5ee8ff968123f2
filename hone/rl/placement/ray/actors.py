"""What runs in Ray actors: sampler actors (an engine, the reward and environments, producing shares of
steps) and reward workers (a `RewardScorer`, scoring what sampler actors send them).

Neither holds anything of the learner: a sampler actor loads the model once, as its engine's (no
trainable copy beside it), with its own tokenizer, and takes each weight version from the object store;
a reward worker builds only the reward (and the task it grades against), not the training set.

Files: every actor works in the driver's directory when its node has it, so relative paths in a recipe
(model.path, data files) mean the same as locally.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from hone.config import HoneConfig
from hone.data.splits import load_task
from hone.envs.trl_env import is_trl_env
from hone.plugins import adopt_script_objects
from hone.rewards import RewardScorer
from hone.rl.components import build_producer_parts, recipe_env, recipe_reward
from hone.rl.placement.ray.cluster import RayClusterError, await_restart
from hone.rl.placement.source import produce_with_retries
from hone.rl.producer import Producer, ProducerSettings, PromptBatch, ScoredGroups
from hone.rollout.fingerprint import Fingerprint, Fingerprinted
from hone.types import Rollout, Sample

log = logging.getLogger("hone")

# How long one call on an actor may take before the run stops with a line instead of waiting forever.
CALL_TIMEOUT_S = 3600.0


def enter(cwd: str, threads: int, objects: dict[str, Any]) -> None:
    """An actor's start: the driver's directory (when this node has it), its torch threads, and the objects
    the driver's program registered (`script:<name>` rewards and environments, which Ray pickled here)."""
    adopt_script_objects(objects)
    if os.path.isdir(cwd):
        os.chdir(cwd)
    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format="hone: %(message)s")
    # As `hone.cli` does for a local run: an attached cluster's workers do not have the driver's environment.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


class RewardActor:
    """A reward worker: the run's reward built from the recipe, scoring what sampler actors send it."""

    def __init__(self, cfg: dict[str, Any], cwd: str, threads: int, objects: dict[str, Any]) -> None:
        enter(cwd, threads, objects)
        config = HoneConfig.model_validate(cfg)
        # The task only (no training set), and the environment's own reward sources (a TRL environment's
        # get_reward, called here on the instances that travel with the rollouts).
        # Only a TRL environment is built here: another may start a server (its reward is the rollout's).
        trl = is_trl_env(config.env.name, config.env.args)
        self.scorer = recipe_reward(config, load_task(config.data), recipe_env(config) if trl else None)

    def __repr__(self) -> str:  # Ray prefixes the lines it forwards to the driver with this
        return "reward-worker"

    def pid(self) -> int:
        return os.getpid()

    def score(
        self, rollouts: list[Rollout], samples_by_id: dict[str, Sample], step: int = 0
    ) -> tuple[list[Rollout], dict[str, float]]:
        """Score a sampler actor's share of RL step `step` (what TRL-contract rewards read as
        `trainer_state.global_step`)."""
        self.scorer.trainer_state.global_step = step
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
        self.trainer_state = local.trainer_state  # the producer moves its step; each call sends it along

    def score(self, rollouts: list[Rollout], samples_by_id: dict[str, Sample]) -> dict[str, float]:
        ray, count = self._ray, len(self.workers)
        chunks = [(k, rollouts[k::count]) for k in range(count) if rollouts[k::count]]

        def send(k: int, chunk: list[Rollout]) -> Any:
            samples = {r.sample_id: samples_by_id[r.sample_id] for r in chunk}
            try:
                return self.workers[k].score.remote(chunk, samples, self.trainer_state.global_step)
            except TypeError as e:  # Ray pickles the arguments here: an environment's instance may not pickle
                why = _unpicklable(chunk)
                if why is None:
                    raise
                raise TypeError(
                    f"the TRL environment instances travel with their rollouts to the reward workers (for "
                    f"get_reward and environments=), and {why}; set cluster.reward_workers.count: 0 to score "
                    "them in the sampler actor that played them"
                ) from e

        refs = {k: send(k, chunk) for k, chunk in chunks}  # all in flight at once
        metrics: dict[str, float] = {"faults/actor_restarts": 0.0}
        for k, chunk in chunks:
            while True:
                try:
                    scored, part = ray.get(refs[k], timeout=CALL_TIMEOUT_S)
                    break
                except ray.exceptions.RayActorError:
                    metrics["faults/actor_restarts"] += 1
                    log.warning("reward worker %d died; restarted, scoring its rollouts again", k)
                    await_restart(self.workers[k], f"reward worker {k}", self.timeout)
                    refs[k] = send(k, chunk)
                except ray.exceptions.RayTaskError as e:  # the reward raised: as if it had run here
                    raise e.cause from e
                except ray.exceptions.GetTimeoutError:
                    raise RayClusterError(
                        f"reward worker {k} scored nothing within {CALL_TIMEOUT_S:g} s"
                    ) from None
            for mine, theirs in zip(chunk, scored, strict=True):
                mine.reward, mine.reward_parts = theirs.reward, theirs.reward_parts
                mine.metrics.update(theirs.metrics)
                mine.extra.update(theirs.extra)  # a TRL reward's `log_extra` columns
                mine.env_state = None  # scored, as a local scorer leaves it (`Rollout.env_state`)
            for key, value in part.items():  # counts add up, means are weighted by the chunk's size
                share = 1.0 if key in ("reward/errors", "reward/timeouts") else len(chunk) / len(rollouts)
                metrics[key] = metrics.get(key, 0.0) + value * share
        return metrics


def _unpicklable(rollouts: list[Rollout]) -> str | None:
    """Why the first environment instance among `rollouts` that Ray cannot pickle does not pickle, in one
    line (Ray's own message lists the whole argument); None when every one pickles."""
    from ray import cloudpickle

    for rollout in rollouts:
        if rollout.env_state is None:
            continue
        try:
            cloudpickle.dumps(rollout.env_state)
        except Exception as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            return f"{type(rollout.env_state).__name__} does not pickle ({reason})"
    return None


class SamplerActor:
    """A producer in its own process: an engine, the reward (or `RemoteRewards` over the reward workers),
    the environments and the training prompts (dynamic sampling refills from them); `load` installs a
    weight version, `produce` produces a share (retried as locally: `produce_with_retries`). Ray runs an
    actor's calls one at a time, in order, so a `load` lands between shares: every share is sampled with
    one version, and every share submitted after a publish with that version or a newer one."""

    def __init__(
        self, cfg: dict[str, Any], cwd: str, threads: int, objects: dict[str, Any], reward_workers: list[Any]
    ) -> None:
        enter(cwd, threads, objects)
        config = HoneConfig.model_validate(cfg)
        self.cfg = config

        # The actor's own data, reward and environments, and the one model it loads: no optimizer, nothing
        # trains it, so an engine that samples over a model object takes it instead of a copy
        # (`reuse_model`); vLLM loads the model files itself.
        def remote(local: RewardScorer) -> RemoteRewards:  # the actor's reward, scored by the workers
            return RemoteRewards(reward_workers, local, config.cluster.start_timeout_s)

        parts = build_producer_parts(config, remote if reward_workers else None)
        self.engine = parts.sampler
        self.producer = Producer(parts, ProducerSettings.of(config))

    def __repr__(self) -> str:
        return "sampler"

    def pid(self) -> int:
        return os.getpid()

    def load(self, version: int, tensors: dict[str, torch.Tensor]) -> tuple[int, Fingerprint | None]:
        """Install `tensors` as `version`; the version the engine then says it holds and the fingerprint
        of the weights it holds (None: the engine cannot report one), which the driver verifies."""
        self.engine.load_weights(tensors, version)
        held = self.engine.weights_fingerprint(tensors) if isinstance(self.engine, Fingerprinted) else None
        return self.engine.policy_version, held

    def produce(self, prompts: PromptBatch, retries: int) -> ScoredGroups:
        return produce_with_retries(self.producer, prompts, retries)

    def close(self) -> None:
        self.engine.close()

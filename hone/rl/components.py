"""Build a run's parts from its config, each by its owner: data splits (`hone.data.splits`), the reward
(`hone.rewards.resolve`), the policy (`hone.training.models`), the sampler (`hone.rollout.engines`).

Cheap checks come first (data files, rows, reward import, model path), so bad input fails in
seconds with one clear line, before any model is loaded or trained.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from transformers import PreTrainedTokenizerBase
from transformers.processing_utils import ProcessorMixin

from hone.config import HoneConfig
from hone.data import Task
from hone.data.splits import load_recipe_data
from hone.envs import Environment, env_reads_answer, release_envs
from hone.envs import make_env as _make_env
from hone.envs.parsers import get_parser
from hone.envs.trl_env import trl_env_rewards
from hone.models import resolve_model
from hone.rewards import RewardScorer
from hone.rewards.resolve import load_reward, reward_correctness_component
from hone.rewards.scoring import VERIFIER_REWARDS
from hone.rl.placement.weights import LocalWeightChannel, WeightChannel
from hone.rollout import Sampler
from hone.rollout.agent import AgentEpisodes, load_agent
from hone.rollout.engines import ModelFiles, WeightSource, engine_capabilities, get_engine
from hone.rollout.multiturn import EpisodeLimits, Episodes
from hone.run.lifecycle import SetupError
from hone.training.models import check_teacher_tokenizer, check_tokenizer, load_policy, pad_token_id
from hone.training.policy import Policy
from hone.types import Sample

log = logging.getLogger("hone")


@dataclass(frozen=True, kw_only=True)
class Playing:
    """What plays and scores episodes: the sampler, the tokenizer and processor (a vision-language
    model's, else None) rendering prompts and environment images, the reward, and how episodes are played
    (an environment's episodes, an agent's, else single-turn)."""

    sampler: Sampler
    tokenizer: PreTrainedTokenizerBase
    processor: ProcessorMixin | None
    reward: RewardScorer
    episodes: Episodes | None = None
    agent: AgentEpisodes | None = None


@dataclass(frozen=True, kw_only=True)
class ProducerParts(Playing):
    """What a producer reads (`hone.rl.producer.Producer`, `collect_rollouts`): what plays episodes, and
    the training prompts (dynamic sampling refills from them)."""

    train_samples: list[Sample]

    @classmethod
    def of(
        cls,
        policy: Policy,
        sampler: Sampler,
        reward: RewardScorer,
        train_samples: list[Sample],
        episodes: Episodes | None = None,
        agent: AgentEpisodes | None = None,
    ) -> ProducerParts:
        """The view of a run's producer: `policy` gives the tokenizer and processor."""
        return cls(
            sampler=sampler,
            tokenizer=policy.tokenizer,
            processor=policy.processor,
            reward=reward,
            train_samples=train_samples,
            episodes=episodes,
            agent=agent,
        )


@dataclass(frozen=True, kw_only=True)
class EvalParts(Playing):
    """What held-out evaluation reads (`hone.rl.evaluate.run_eval`): what plays episodes, and the eval
    split."""

    eval_samples: list[Sample]
    # False: the eval set has no answer column and no reward component grades correctness, so the eval
    # reports the reward, not accuracy (`reports_accuracy`).
    accuracy: bool = True


@dataclass(frozen=True)
class PlacementParts:
    """What a placement back-end builds its executor from (`hone.rl.placement.build.ExecutorFactory`): the
    producer's view, the channel that publishes to the run's sampler and what a publish sends (a remote
    sampler's copy), and the policy with its model files, from which another producer builds its own
    sampler (`producer_replica`)."""

    producer: ProducerParts
    weights: WeightChannel
    weight_source: WeightSource
    policy: Policy
    model_path: str


@dataclass(frozen=True, kw_only=True)
class RunComponents:
    """A run's parts as `build_components` assembled them, never changed after: the learner's (the policy,
    pad id, model path, the weight channel to the sampler and what it publishes), and what the producer
    (`producer`) and evaluation (`evaluation`) read. On N learner ranks `LeadRanks.gather_weights` returns
    another whole whose channel publishes the gathered weights. The KL reference and the distillation
    teacher are the learner's models (`hone.rl.start.LearnerModels`), loaded when RL starts."""

    policy: Policy
    sampler: Sampler
    weights: WeightChannel  # the policy's weights → the sampler's own copy, versioned
    weight_source: WeightSource  # what a publish sends (`weight_source`; on N ranks the gathered weights)
    reward: RewardScorer
    train_samples: list[Sample]
    eval_samples: list[Sample]
    task: Task | None
    pad_id: int
    model_path: str
    episodes: Episodes | None = None  # multi-turn runs: a fresh environment per episode, and limits
    agent: AgentEpisodes | None = None  # `rollout.agent`: it plays the episodes, through the endpoint
    eval_accuracy: bool = True  # the eval counts correct responses (`reports_accuracy`)

    @property
    def producer(self) -> ProducerParts:
        """The producer's view."""
        return ProducerParts.of(
            self.policy, self.sampler, self.reward, self.train_samples, self.episodes, self.agent
        )

    @property
    def placement(self) -> PlacementParts:
        """The placement back-end's view."""
        return PlacementParts(self.producer, self.weights, self.weight_source, self.policy, self.model_path)

    @property
    def evaluation(self) -> EvalParts:
        """Evaluation's view."""
        return EvalParts(
            sampler=self.sampler,
            tokenizer=self.policy.tokenizer,
            processor=self.policy.processor,
            reward=self.reward,
            eval_samples=self.eval_samples,
            episodes=self.episodes,
            agent=self.agent,
            accuracy=self.eval_accuracy,
        )


def build_components(cfg: HoneConfig, *, reuse_model: bool = False) -> RunComponents:
    """The run's parts. `reuse_model`: nothing trains the policy (`hone eval`, `hone pairs`), so the sampler
    samples over the policy's own model instead of a copy (`build_sampler`): one copy of the weights."""
    make_env = recipe_env(cfg)
    agent_spec = load_agent(cfg.rollout.agent) if cfg.rollout.agent else None
    if agent_spec is not None:
        try:  # a bad name fails before the model loads
            get_parser(cfg.rollout.agent_tool_parser)
        except ValueError as e:
            raise ValueError(f"rollout.agent_tool_parser: {e}") from None
    task, train_samples, eval_samples = recipe_data(cfg, make_env)
    reward = recipe_reward(cfg, task, make_env)
    eval_accuracy = reports_accuracy(cfg, eval_samples)
    if not eval_accuracy:  # once per run: said where the run's parts are built, not at every eval
        log.info(
            "no answer column: eval reports the reward, not accuracy (a reward.components entry with "
            "correctness: true, or a verifier reward, would grade correctness)"
        )
    model_path = resolve_model(cfg.model.path)
    policy = load_policy(cfg.model, model_path)
    check_tokenizer(policy, model_path)
    tokenizer = policy.tokenizer
    assert tokenizer is not None  # check_tokenizer refuses a model without one
    if cfg.distill.teacher is not None:  # before an SFT warm start or any sampling
        check_teacher_tokenizer(cfg.distill, tokenizer, cfg.model.path)
    pad_id = pad_token_id(tokenizer)
    warn_unverified(cfg)  # once per run: producer replicas and Ray actors build theirs elsewhere
    sampler = build_sampler(cfg, policy, model_path, reuse_model=reuse_model)
    source = weight_source(cfg, policy)
    episodes = run_episodes(cfg, make_env)
    agent = None
    if agent_spec is not None:  # last: nothing after it can fail and leave the server running
        from hone.rollout.endpoint import EndpointServer  # aiohttp: the `agents` extra

        server = EndpointServer(
            sampler,
            tokenizer,
            model_name=model_path,
            parser=cfg.rollout.agent_tool_parser,
            port=cfg.rollout.agent_port,
        )
        agent = AgentEpisodes(
            agent_spec,
            server,
            concurrency=cfg.rollout.agent_concurrency,
            timeout_s=cfg.rollout.agent_timeout_s,
            max_completions=cfg.rollout.agent_max_completions,
        )
    return RunComponents(
        policy=policy,
        sampler=sampler,
        weights=weight_channel(cfg, source, sampler),
        weight_source=source,
        reward=reward,
        train_samples=train_samples,
        eval_samples=eval_samples,
        task=task,
        pad_id=pad_id,
        model_path=model_path,
        episodes=episodes,
        agent=agent,
        eval_accuracy=eval_accuracy,
    )


def recipe_env(cfg: HoneConfig) -> Callable[[], Environment] | None:
    """The recipe's environment factory (`env.name`, `env.args`), None for single-turn prompts; a TRL
    environment's `reset` gets a row's reference answer back under `data.answer_field`."""
    if cfg.env.name is None:
        return None
    return _make_env(cfg.env.name, cfg.env.args, answer_field=cfg.data.answer_field)


def recipe_data(
    cfg: HoneConfig, make_env: Callable[[], Environment] | None
) -> tuple[Task | None, list[Sample], list[Sample]]:
    """The run's task and splits; a row's reference answer is required only where something reads it
    (a TRL environment reads the row's columns instead)."""
    return load_recipe_data(cfg, make_env, env_reads_answer=env_reads_answer(cfg.env.name, cfg.env.args))


def recipe_reward(
    cfg: HoneConfig, task: Task | None, make_env: Callable[[], Environment] | None
) -> RewardScorer:
    """The `reward` section's scorer, with the environment's own reward sources (a TRL environment's
    `get_reward`) beside its components."""
    return load_reward(
        cfg.reward,
        task,
        answer_field=cfg.data.answer_field,
        max_steps=cfg.run.steps,
        env_rewards=trl_env_rewards(make_env),
    )


def reports_accuracy(cfg: HoneConfig, eval_samples: list[Sample]) -> bool:
    """Whether the held-out eval can say a response is right: some eval sample has a reference answer (a
    task's, a game's, a dataset's answer column), or the reward's correctness component grades without
    one (a verifier: `code` runs its tests column, `math` with its own answer_field; or one marked
    `correctness: true`). A prompt-only dataset (TRL's basic GRPO rows) scored by shaping or plugin
    rewards has neither: its total reward at full marks would say nothing about being right."""
    if not eval_samples or any(s.answer is not None for s in eval_samples):
        return True
    name = reward_correctness_component(cfg.reward)
    if name is None:
        return False
    component = cfg.reward.resolved()[name]
    return component.correctness or component.fn in VERIFIER_REWARDS


def build_sampler(cfg: HoneConfig, policy: Policy, model_path: str, *, reuse_model: bool = False) -> Sampler:
    """The `rollout.engine` sampler, owning a copy of the policy's current weights (version 0); with
    `reuse_model`, `policy`'s model is the sampler's to take (`Engine.build`)."""
    engine = get_engine(cfg.rollout.engine)
    return engine.build(cfg.rollout, policy, ModelFiles(model_path, cfg.model.dtype, reuse_model))


def warn_unverified(cfg: HoneConfig) -> None:
    """One line at start when `trainer.verify_weights` can check only the version number of each load:
    the engine reports no fingerprint of the weights it holds (`EngineCapabilities.fingerprint`)."""
    if cfg.trainer.verify_weights and not engine_capabilities(cfg.rollout.engine).fingerprint:
        log.warning(
            "trainer.verify_weights: the %r engine reports no weight fingerprint, so only the version number "
            "of each weight load is checked, not the weights",
            cfg.rollout.engine,
        )


def weight_source(cfg: HoneConfig, policy: Policy) -> WeightSource:
    """What a publish sends the run's samplers: the weights in the form the `rollout.engine` loads."""
    return get_engine(cfg.rollout.engine).weight_source(policy)


def weight_channel(cfg: HoneConfig, source: WeightSource, sampler: Sampler) -> LocalWeightChannel:
    """The in-process channel from the policy's `source` (`weight_source`) to `sampler`."""
    return LocalWeightChannel(
        source,
        sampler,
        timeout_s=cfg.cluster.publish_timeout_s,
        verify=cfg.trainer.verify_weights,
        interruptible=cfg.rollout.interruptible,
    )


def producer_replica(cfg: HoneConfig, parts: PlacementParts) -> tuple[ProducerParts, LocalWeightChannel]:
    """Another producer's view of the run (`cluster.producers`): its own sampler, a copy of the policy's
    current weights made the version the run's sampler was last published, and the channel feeding it;
    the reward, data and environments are shared."""
    sampler = build_sampler(cfg, parts.policy, parts.model_path)
    weights = weight_channel(cfg, parts.weight_source, sampler)
    weights.publish(parts.weights.published)
    return replace(parts.producer, sampler=sampler), weights


def build_producer_parts(
    cfg: HoneConfig, remote_reward: Callable[[RewardScorer], Any] | None = None
) -> ProducerParts:
    """A producer of its own (a Ray sampler actor): the training split, the reward (`remote_reward` wraps
    it: scored by reward workers), the policy's model loaded once and taken by the sampler (`reuse_model`:
    no optimizer, nothing trains it), and the environments. No eval split, no weight channel: weights come
    with each `load`."""
    make_env = recipe_env(cfg)
    task, train_samples, _ = recipe_data(cfg, make_env)
    reward = recipe_reward(cfg, task, make_env)
    if remote_reward is not None:
        reward = remote_reward(reward)
    model_path = resolve_model(cfg.model.path)
    policy = load_policy(cfg.model, model_path)  # the model as the learner builds it; no optimizer
    sampler = build_sampler(cfg, policy, model_path, reuse_model=True)
    return ProducerParts.of(policy, sampler, reward, train_samples, run_episodes(cfg, make_env))


def close_samplers(*parts: RunComponents | ProducerParts) -> None:
    """Stop what the samplers run outside this process (a vLLM engine; the HF sampler has nothing), and
    the agent endpoint serving them."""
    for p in parts:
        if p.agent is not None:
            p.agent.close()
        p.sampler.close()


def run_episodes(cfg: HoneConfig, make_env: Callable[[], Environment] | None) -> Episodes | None:
    """A multi-turn run's episodes (`env.name`): a fresh environment each, and the limits; else None."""
    return None if make_env is None else Episodes(make_env, episode_limits(cfg, make_env))


def episode_limits(cfg: HoneConfig, make_env: Callable[[], Environment]) -> EpisodeLimits:
    return EpisodeLimits(
        max_turns=cfg.env.max_turns or make_env().max_turns,
        max_tokens_per_turn=cfg.env.max_tokens_per_turn,
        max_total_tokens=cfg.env.max_total_tokens,
    )


def setup_components(cfg: HoneConfig, *, reuse_model: bool = False) -> RunComponents:
    """`build_components`, with bad input (files, rows, names, paths) turned into one-line `SetupError`s.
    A failure stops what the environment started before it (an OpenEnv server)."""
    try:
        try:
            return build_components(cfg, reuse_model=reuse_model)
        except BaseException:
            release_envs()
            raise
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as e:
        raise SetupError(e.args[0] if e.args else repr(e)) from e

"""Build a run's parts from its config: data, reward, policy (+ SFT warm-start), reference, sampler.

Cheap checks come first (data files, rows, reward import, model path), so bad input fails in
seconds with one clear line, before any model is loaded or trained.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hone.config import HoneConfig
from hone.data import Task, get_task, load_samples
from hone.envs import Environment
from hone.envs import make_env as _make_env
from hone.models import resolve_model
from hone.rewards import REWARDS, RewardComponent, RewardScorer, task_reward
from hone.rewards.sandbox import set_max_concurrency as set_sandbox_concurrency
from hone.rollout import HFSampler, Sampler
from hone.rollout.multiturn import EpisodeLimits, Episodes
from hone.training.policy import LoraSettings, Policy
from hone.types import Sample

log = logging.getLogger("hone")

EVAL_SEED = 0  # fixed, so every run of a task is scored on the same held-out problems


@dataclass
class RunComponents:
    policy: Policy
    ref_policy: Policy | None
    sampler: Sampler
    reward: RewardScorer
    train_samples: list[Sample]
    eval_samples: list[Sample]
    task: Task | None
    pad_id: int
    model_path: str
    episodes: Episodes | None = None  # multi-turn runs: a fresh environment per episode, and limits


def load_data(
    cfg: HoneConfig, env: Callable[[], Environment] | None = None
) -> tuple[Task | None, list[Sample], list[Sample]]:
    data = cfg.data
    eval_size = cfg.eval.size or data.eval_size
    if env is not None and data.task is None and data.source is None:  # a self-contained game
        game = type(env())
        return (
            None,
            game.make_samples(data.train_size, cfg.run.seed, "train", **cfg.env.args),
            game.make_samples(eval_size, EVAL_SEED, "eval", **cfg.env.args),
        )
    if data.task is not None:
        task = get_task(data.task, **data.task_args)
        return (
            task,
            task.train_samples(data.train_size, seed=cfg.run.seed),
            task.eval_samples(eval_size, EVAL_SEED),
        )
    assert data.source is not None
    fields = dict(
        prompt_field=data.prompt_field,
        answer_field=data.answer_field,
        messages_field=data.messages_field,
        subset=data.subset,
    )
    train = load_samples(data.source, split="train", **fields)
    if data.eval_source is None:
        raise ValueError("data.eval_source is required with data.source (a held-out split to evaluate on)")
    return None, train, load_samples(data.eval_source, split="test", limit=eval_size, **fields)


def load_reward(cfg: HoneConfig, task: Task | None) -> RewardScorer:
    """Build every reward component (factories run now, so a bad arg or path fails before training)."""
    if cfg.reward.sandbox_concurrency is not None:
        set_sandbox_concurrency(cfg.reward.sandbox_concurrency)
    else:  # as many as the reward calls in flight: a call's timeout must not run out waiting for a slot
        set_sandbox_concurrency(cfg.reward.max_concurrency)
    components = [
        RewardComponent(name, _reward_fn(name, c.fn, c.args, task), c.weight, c.timeout_s)
        for name, c in cfg.reward.resolved().items()
    ]
    return RewardScorer(
        components, timeout_s=cfg.reward.timeout_s, max_concurrency=cfg.reward.max_concurrency
    )


def _reward_fn(name: str, spec: str, args: dict[str, Any], task: Task | None) -> Any:
    where = f"reward {name!r} (fn {spec!r})"
    if spec == "task":
        if task is None:
            raise ValueError(
                f"{where} needs data.task; for a dataset choose a built-in reward or 'pkg.mod:fn'"
            )
        if args:
            raise ValueError(f"{where} takes no args")
        return task_reward(task)
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except Exception as e:  # a missing module, a typo, or the module failing as it is imported
            raise ValueError(f"{where} cannot be imported: {type(e).__name__}: {e}") from None
        if not callable(obj):
            raise ValueError(f"{where} is not callable")
        factory = obj if args else None  # with args the object is a factory, as built-in rewards are
    elif spec in REWARDS:
        factory = REWARDS[spec]
    else:
        raise ValueError(f"{where}: unknown reward; built-in: {', '.join(sorted(REWARDS))}, or 'pkg.mod:fn'")
    if factory is None:
        return obj
    try:
        return factory(**args)
    except TypeError as e:
        raise ValueError(f"{where}: bad args {args}: {e}") from None
    except (ValueError, RuntimeError, OSError) as e:
        raise ValueError(f"{where}: {e}") from None


def load_policy(cfg: HoneConfig, path: str) -> Policy:
    lora = cfg.model.lora
    return Policy.from_pretrained(
        path,
        dtype=cfg.model.dtype,
        lora=None if lora is None else LoraSettings(lora.r, lora.alpha, lora.dropout, lora.target_modules),
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        device=cfg.model.device,
    )


def load_reference(cfg: HoneConfig, start_dir: str) -> Policy:
    """A frozen copy of the policy where RL started (the SFT result when there was one)."""
    ref = load_policy(cfg, start_dir)
    ref.model.eval().requires_grad_(False)
    return ref


def build_components(cfg: HoneConfig) -> RunComponents:
    make_env = _make_env(cfg.env.name, cfg.env.args) if cfg.env.name else None
    task, train_samples, eval_samples = load_data(cfg, make_env)
    reward = load_reward(cfg, task)
    model_path = resolve_model(cfg.model.path)
    policy = load_policy(cfg, model_path)
    tokenizer = policy.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # In-process and synchronous, the sampler shares the policy's model object: no weight copies.
    engines = {
        "hf": lambda: HFSampler(
            policy.model,
            tokenizer,
            max_batch_size=cfg.rollout.max_batch_size,
            prefix_cache=cfg.rollout.prefix_cache,
        )
    }
    sampler = engines[cfg.rollout.engine]()
    episodes = None if make_env is None else Episodes(make_env, episode_limits(cfg, make_env))
    return RunComponents(
        policy, None, sampler, reward, train_samples, eval_samples, task, pad_id, model_path, episodes
    )


def episode_limits(cfg: HoneConfig, make_env: Callable[[], Environment]) -> EpisodeLimits:
    return EpisodeLimits(
        max_turns=cfg.env.max_turns or make_env().max_turns,
        max_tokens_per_turn=cfg.env.max_tokens_per_turn,
        max_total_tokens=cfg.env.max_total_tokens,
    )

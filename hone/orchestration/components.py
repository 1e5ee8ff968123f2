"""Build a run's parts from its config: data, reward, policy (+ SFT warm-start), reference, sampler.

Cheap checks come first (data files, rows, reward import, model path), so bad input fails in
seconds with one clear line, before any model is loaded or trained.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from hone.config import HoneConfig
from hone.data import Task, get_task, load_samples
from hone.data.gym import PREFIX as GYM_PREFIX
from hone.data.gym import ReasoningGymTask
from hone.envs import Environment
from hone.envs import make_env as _make_env
from hone.envs.parsers import get_parser
from hone.models import resolve_model
from hone.orchestration.weights import LocalWeightChannel, WeightChannel
from hone.plugins import load_object
from hone.rewards import REWARDS, BatchRewardFn, RewardComponent, RewardScorer, task_reward
from hone.rewards.registry import TEXT_REWARDS
from hone.rollout import HFSampler, Sampler, eos_token_ids
from hone.rollout.agent import AgentEpisodes, load_agent
from hone.rollout.multiturn import EpisodeLimits, Episodes
from hone.training.critic import ValueModel
from hone.training.policy import ADAPTER_DIR, AdapterReference, LoraSettings, Policy, weights_digest
from hone.types import Rollout, Sample
from hone.verifiers.sandbox import set_max_concurrency as set_sandbox_concurrency

log = logging.getLogger("hone")

EVAL_SEED = 0  # fixed, so every run of a task is scored on the same held-out problems


@dataclass(kw_only=True)
class RunComponents:
    policy: Policy
    ref_policy: Policy | None
    sampler: Sampler
    weights: WeightChannel  # the policy's weights → the sampler's own copy, versioned
    reward: RewardScorer
    train_samples: list[Sample]
    eval_samples: list[Sample]
    task: Task | None
    pad_id: int
    model_path: str
    episodes: Episodes | None = None  # multi-turn runs: a fresh environment per episode, and limits
    agent: AgentEpisodes | None = None  # `rollout.agent`: it plays the episodes, through the endpoint


def load_data(
    cfg: HoneConfig, env: Callable[[], Environment] | None = None
) -> tuple[Task | None, list[Sample], list[Sample]]:
    data = cfg.data
    eval_size = cfg.eval.size or data.eval_size
    if env is not None and data.task is None and data.source is None:  # a self-contained game
        game = type(env())
        train = game.make_samples(data.train_size, cfg.run.seed, "train", **cfg.env.args)
        return None, train, held_out_samples(cfg, None, env, eval_size)
    if data.task is not None:
        task = get_task(data.task, **data.task_args)
        train = task.train_samples(data.train_size, seed=cfg.run.seed)
        return task, train, held_out_samples(cfg, task, env, eval_size)
    assert data.source is not None
    if data.source.startswith(GYM_PREFIX):
        task = ReasoningGymTask(data.source.removeprefix(GYM_PREFIX), data.args)
        train = task.train_samples(data.train_size, seed=cfg.run.seed)
        return task, train, held_out_samples(cfg, task, env, eval_size)
    train = load_samples(data.source, split="train", **_dataset_fields(cfg))
    return None, train, held_out_samples(cfg, None, env, eval_size)


def held_out_samples(
    cfg: HoneConfig,
    task: Task | None,
    env: Callable[[], Environment] | None,
    n: int,
    *,
    at_most: bool = False,
) -> list[Sample]:
    """The first `n` problems of the run's held-out stream, which it never trains on: the task's or the
    game's eval split (drawn with `EVAL_SEED`), or the rows of `data.eval_source`. A longer stream starts
    with a shorter one, so the eval set and SFT validation take consecutive, disjoint stretches of it.
    A task whose eval split has fewer than `n` distinct problems is an error, or with `at_most` gives
    the ones it has (a game's split and a file's rows never fail for being short)."""
    if task is not None:
        return task.eval_samples(n, EVAL_SEED, at_most=at_most)
    if env is not None and cfg.data.source is None:
        return type(env()).make_samples(n, EVAL_SEED, "eval", **cfg.env.args)
    if cfg.data.eval_source is None:
        raise ValueError("data.eval_source is required with data.source (a held-out split to evaluate on)")
    return load_samples(cfg.data.eval_source, split="test", limit=n, **_dataset_fields(cfg))


def validation_samples(
    cfg: HoneConfig,
    task: Task | None,
    env: Callable[[], Environment] | None,
    train: list[Sample],
    eval_set: list[Sample],
) -> list[Sample]:
    """SFT's validation problems: the `sft.val_size` held-out problems that follow the eval set, less any
    that repeat a training or eval problem. Early stopping then sees neither an RL training prompt nor
    a problem the final eval scores. A held-out split with fewer problems (a small task, a tiny game, a
    short eval file) validates on those it has beyond the eval set, or, with none, on eval problems;
    each with a warning."""
    n = len(eval_set) + cfg.sft.val_size
    stream = held_out_samples(cfg, task, env, n, at_most=True)[len(eval_set) :]
    seen = {problem_key(s) for s in [*train, *eval_set]}
    fresh = [s for s in stream if problem_key(s) not in seen]
    if fresh:
        if len(fresh) < cfg.sft.val_size:
            log.warning(
                "SFT validation: the held-out split has only %d problems beyond the eval set's %d that "
                "repeat no training or eval problem (sft.val_size %d); validating on those",
                len(fresh),
                len(eval_set),
                cfg.sft.val_size,
            )
        return fresh
    log.warning(
        "SFT validation: the held-out split has no problems beyond the eval set's %d; validating on "
        "eval problems (early stopping sees the eval set)",
        len(eval_set),
    )
    return (stream or eval_set)[: cfg.sft.val_size]


def problem_key(sample: Sample) -> tuple[str | None, str | None, str | None]:
    """What makes two samples the same problem: the question and its reference answer (not the id)."""
    messages = None if sample.messages is None else json.dumps(sample.messages, sort_keys=True, default=str)
    return sample.prompt, messages, sample.answer


def _dataset_fields(cfg: HoneConfig) -> dict[str, Any]:
    data = cfg.data
    return dict(
        prompt_field=data.prompt_field,
        answer_field=data.answer_field,
        messages_field=data.messages_field,
        subset=data.subset,
    )


def load_reward(cfg: HoneConfig, task: Task | None) -> RewardScorer:
    """Build every reward component (factories run now, so a bad arg or path fails before training)."""
    if cfg.reward.sandbox_concurrency is not None:
        set_sandbox_concurrency(cfg.reward.sandbox_concurrency)
    else:  # as many as the reward calls in flight: a call's timeout must not run out waiting for a slot
        set_sandbox_concurrency(cfg.reward.max_concurrency)
    correctness = cfg.reward.correctness_component()
    if correctness is None:
        log.warning(
            "no reward component grades correctness (a verifier, or one with correctness: true): "
            "eval/accuracy counts responses whose total reward is full marks"
        )
    components = [
        RewardComponent(
            name, _reward_fn(name, c.fn, c.args, task), c.weight, c.timeout_s, correctness=name == correctness
        )
        for name, c in cfg.reward.resolved().items()
    ]
    return RewardScorer(
        components, timeout_s=cfg.reward.timeout_s, max_concurrency=cfg.reward.max_concurrency
    )


def _reward_fn(name: str, spec: str, args: dict[str, Any], task: Task | None) -> Any:
    where = f"reward {name!r} (fn {spec!r})"
    text = "final"
    if spec == "task":
        if task is None:
            raise ValueError(
                f"{where} needs data.task or data.source reasoning_gym:<name>; "
                "for a dataset choose a built-in reward or 'pkg.mod:fn'"
            )
        if args:
            raise ValueError(f"{where} takes no args")
        return task_reward(task)
    if ":" in spec:
        obj = load_object(spec, what=where)
        if not callable(obj):
            raise ValueError(f"{where} is not callable")
        factory = obj if args else None  # with args the object is a factory, as built-in rewards are
    elif spec in REWARDS:
        factory = REWARDS[spec]
        # The task's defaults for this reward (e.g. arithmetic: `math` refuses sums left undone);
        # the recipe's args win.
        args = {**(task.reward_args.get(spec, {}) if task is not None else {}), **args}
        if spec in TEXT_REWARDS:
            text = args.pop("text", "final")
            if text not in ("final", "all"):
                raise ValueError(
                    f"{where}: text must be 'final' (the last assistant message) or 'all', got {text!r}"
                )
    else:
        raise ValueError(f"{where}: unknown reward; built-in: {', '.join(sorted(REWARDS))}, or 'pkg.mod:fn'")
    if factory is None:
        return obj
    try:
        fn = factory(**args)
    except TypeError as e:
        raise ValueError(f"{where}: bad args {args}: {e}") from None
    except (ValueError, RuntimeError, OSError) as e:
        raise ValueError(f"{where}: {e}") from None
    return fn if text == "final" else all_assistant_text(fn)


def all_assistant_text(fn: Any) -> Any:
    """A text reward that scores every assistant message of an episode, joined, as its response
    (`Rollout.assistant_text("all")`) instead of the final one; single-turn rollouts are unchanged."""
    if isinstance(fn, BatchRewardFn):
        return _AllTextBatch(fn)

    def scored(rollout: Rollout, sample: Sample) -> Any:
        return fn(_all_text(rollout), sample)  # an async reward's coroutine is awaited by the scorer

    return scored


@dataclass
class _AllTextBatch:
    fn: BatchRewardFn

    def score_batch(self, rollouts: list[Rollout], samples: list[Sample]) -> list[Any]:
        return self.fn.score_batch([_all_text(r) for r in rollouts], samples)


def _all_text(rollout: Rollout) -> Rollout:
    return replace(rollout, response_text=rollout.assistant_text("all"))


def load_policy(cfg: HoneConfig, path: str) -> Policy:
    lora = cfg.model.lora
    return Policy.from_pretrained(
        path,
        dtype=cfg.model.dtype,
        lora=None if lora is None else LoraSettings(lora.r, lora.alpha, lora.dropout, lora.target_modules),
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        device=cfg.model.device,
    )


def load_reference(
    cfg: HoneConfig, policy: Policy, start_dir: str, *, warm_started: bool
) -> tuple[Policy, dict[str, str]]:
    """The frozen policy where RL started (the SFT result of a warm start), and its record for checkpoints:
    `{"path": start_dir, "sha256": weights_digest}`, so a resumed run can refuse a different reference.

    With LoRA it is the policy's own model, no second copy: the base with the adapter disabled, or, after
    a warm start (which trained the adapter), the base with the SFT adapter swapped in. Otherwise a frozen
    copy loaded from `start_dir`.
    """
    if policy.is_lora:
        adapter = None
        if warm_started:
            adapter_file = Path(start_dir) / ADAPTER_DIR / "adapter_model.safetensors"
            adapter = load_file(adapter_file, device=str(policy.device))
        ref: Policy = AdapterReference(policy, adapter)
        tensors = ref.weights()
    else:
        ref = load_policy(cfg, start_dir)
        ref.model.eval().requires_grad_(False)
        tensors = ref.model.state_dict()
    return ref, {"path": str(start_dir), "sha256": weights_digest(tensors)}


def load_critic(cfg: HoneConfig, policy: Policy, start_dir: str) -> ValueModel:
    """PPO's value model: the trunk of `critic.path` (a saved critic keeps its head), or by default of the
    policy where RL starts (`start_dir`: the SFT result after a warm start), with a new value head. A LoRA
    policy's start directory holds merged weights, so the critic is always a full model."""
    assert cfg.critic is not None
    path = resolve_model(cfg.critic.path) if cfg.critic.path is not None else start_dir
    return ValueModel.from_pretrained(path, dtype=cfg.model.dtype, device=policy.device)


def build_components(cfg: HoneConfig) -> RunComponents:
    make_env = _make_env(cfg.env.name, cfg.env.args) if cfg.env.name else None
    agent_spec = load_agent(cfg.rollout.agent) if cfg.rollout.agent else None
    if agent_spec is not None:
        try:  # a bad name fails before the model loads
            get_parser(cfg.rollout.agent_tool_parser)
        except ValueError as e:
            raise ValueError(f"rollout.agent_tool_parser: {e}") from None
    task, train_samples, eval_samples = load_data(cfg, make_env)
    reward = load_reward(cfg, task)
    model_path = resolve_model(cfg.model.path)
    policy = load_policy(cfg, model_path)
    check_tokenizer(policy, model_path)
    tokenizer = policy.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sampler = build_sampler(cfg, policy, model_path)
    episodes = None if make_env is None else Episodes(make_env, episode_limits(cfg, make_env))
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
        ref_policy=None,
        sampler=sampler,
        weights=weight_channel(cfg, policy, sampler),
        reward=reward,
        train_samples=train_samples,
        eval_samples=eval_samples,
        task=task,
        pad_id=pad_id,
        model_path=model_path,
        episodes=episodes,
        agent=agent,
    )


def build_sampler(cfg: HoneConfig, policy: Policy, model_path: str) -> Sampler:
    """The `rollout.engine` sampler, owning a copy of the policy's current weights (version 0): a copy of
    the model object for `hf`, the model directory loaded by a vLLM engine process for `vllm`."""
    if cfg.rollout.engine == "vllm":
        from hone.rollout.vllm import VLLMSampler

        return VLLMSampler(
            model_path,
            policy.tokenizer,
            eos_token_ids(policy.model, policy.tokenizer),
            python=cfg.rollout.vllm_python,
            dtype=cfg.model.dtype,
            kv_cache_gib=cfg.rollout.vllm_kv_cache_gib,
            timeout_s=cfg.rollout.vllm_timeout_s,
        )
    return HFSampler(
        sampler_model(policy, cfg.rollout.dtype),
        policy.tokenizer,
        max_batch_size=cfg.rollout.max_batch_size,
        prefix_cache=cfg.rollout.prefix_cache,
    )


def weight_source(cfg: HoneConfig, policy: Policy) -> Callable[[], dict[str, torch.Tensor]]:
    """What a publish sends the run's samplers: the trainable tensors into the HF sampler's model copy;
    the whole HF-named state dict (LoRA merged) for an engine that loads plain weights (vLLM)."""
    return policy.state_dict_for_sampler if cfg.rollout.engine == "vllm" else partial(sampler_tensors, policy)


def weight_channel(cfg: HoneConfig, policy: Policy, sampler: Sampler) -> LocalWeightChannel:
    """The in-process channel from the policy to `sampler` (`weight_source`)."""
    return LocalWeightChannel(weight_source(cfg, policy), sampler, timeout_s=cfg.trainer.publish_timeout_s)


def producer_replica(cfg: HoneConfig, parts: RunComponents) -> RunComponents:
    """Another producer's view of the run (`trainer.producers`): its own sampler, a copy of the policy's
    current weights made the version the run's sampler was last published, and the channel feeding it;
    the reward, data and environments are shared."""
    sampler = build_sampler(cfg, parts.policy, parts.model_path)
    weights = weight_channel(cfg, parts.policy, sampler)
    weights.publish(parts.weights.published)
    return replace(parts, sampler=sampler, weights=weights)


def close_samplers(*parts: RunComponents) -> None:
    """Stop what the samplers run outside this process (a vLLM engine; the HF sampler has nothing), and
    the agent endpoint serving them."""
    for p in parts:
        if p.agent is not None:
            p.agent.close()
        close = getattr(p.sampler, "close", None)
        if close is not None:
            close()


def sampler_model(policy: Policy, dtype: str = "model") -> nn.Module:
    """The sampler's own copy of the policy's model (LoRA wrapper included, so it computes exactly what
    the policy does). It costs one more copy of the weights (two in all: 2 x 4 bytes/parameter in fp32)
    and keeps a learner update from ever changing weights under a generation. Its parameters keep the
    policy's `requires_grad` flags although nothing backpropagates through them: with them off, CPU
    inference ran other kernels (log-probs differed in the last bit, measured on the tiny Qwen2), and a
    synchronous run must sample exactly what it did when the sampler shared the policy's model.
    `rollout.dtype: bfloat16` casts the copy (each publish then casts as it copies: `copy_`)."""
    model = copy.deepcopy(policy.model)
    return model.to(torch.bfloat16) if dtype == "bfloat16" else model


def sampler_tensors(policy: Policy) -> dict[str, torch.Tensor]:
    """What a publish copies into `sampler_model`'s copy: the policy's trainable parameters (a LoRA run:
    the adapter), by the names both models share. Frozen tensors were copied at set-up and never change."""
    return {name: p.detach() for name, p in policy.model.named_parameters() if p.requires_grad}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_tokenizer(policy: Policy, model_path: str) -> None:
    """Refuse a model/tokenizer pair the sampler cannot use. transformers loads a directory without
    tokenizer files as an empty tokenizer (text encodes to no tokens), which would only fail at the
    first generate call, after the model loaded and an eval ran."""
    tokenizer = policy.tokenizer
    if not tokenizer("The answer is 42.", add_special_tokens=False)["input_ids"]:
        local = Path(model_path)
        found = [f for f in TOKENIZER_FILES if (local / f).is_file()] if local.is_dir() else []
        files = f"; it has {', '.join(found)}" if found else f"; it has none of {', '.join(TOKENIZER_FILES)}"
        raise ValueError(f"model {model_path}: no usable tokenizer (text encodes to no tokens){files}")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"model {model_path}: the tokenizer defines no eos_token, so no response can end")
    rows = policy.model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"model {model_path}: the tokenizer has {len(tokenizer)} tokens but the model embeds only {rows}"
        )


def episode_limits(cfg: HoneConfig, make_env: Callable[[], Environment]) -> EpisodeLimits:
    return EpisodeLimits(
        max_turns=cfg.env.max_turns or make_env().max_turns,
        max_tokens_per_turn=cfg.env.max_tokens_per_turn,
        max_total_tokens=cfg.env.max_total_tokens,
    )

"""`hone train --dry-run`: everything a run checks before it trains, then what the model will be asked.

It validates the recipe, loads the data (both splits) and the reward, loads the tokenizer, and prints two
training prompts exactly as the policy sees them (chat template and system prompt applied) with their
reference answers; for an environment, the first observation of an episode and the tools the policy can
call. No model weights load and nothing is written, so a wrong field, template or reward shows in seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable

from transformers import AutoTokenizer

from hone.config import HoneConfig
from hone.data.splits import load_data
from hone.envs import make_env, release_envs
from hone.models import resolve_model
from hone.rewards.resolve import load_reward
from hone.rollout.prompts import render_prompt
from hone.types import Sample

SHOWN = 2  # prompts printed


def dry_run(cfg: HoneConfig, say: Callable[[str], None] = print) -> None:
    factory = make_env(cfg.env.name, cfg.env.args) if cfg.env.name else None
    task, train, held_out = load_data(
        cfg.data, eval_size=cfg.eval.size, seed=cfg.run.seed, make_env=factory, env_args=cfg.env.args
    )
    load_reward(cfg.reward, task)  # imports the reward function and runs its factory: a bad path fails here
    model_path = resolve_model(cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    say(f"data      {len(train)} training prompts, {len(held_out)} held out for eval")
    say(f"model     {cfg.model.path} (tokenizer from {model_path})")
    say(f"reward    {_reward_names(cfg)}")
    try:
        for i, sample in enumerate(train[:SHOWN]):
            say(f"\n--- training prompt {i + 1} of {len(train)} (id {sample.id}) ---")
            if factory is None:
                say(render_prompt(sample, tokenizer, cfg.data.chat_template, cfg.data.system_prompt))
            else:
                _show_episode_start(factory(), sample, say)
            say(f"--- reference answer: {sample.answer!r}")
    finally:
        release_envs()
    say("\ndry run: recipe, data, reward and tokenizer are fine; nothing was trained or written")


def _show_episode_start(env: object, sample: Sample, say: Callable[[str], None]) -> None:
    """The environment's first observation (the messages `reset` returns) and its tools."""
    messages = env.reset(sample)  # type: ignore[attr-defined]
    if inspect.isawaitable(messages):
        messages = asyncio.run(_awaited(messages))
    for message in messages:
        say(f"[{message.get('role')}] {message.get('content')}")
    tools = getattr(env, "tools", None)
    names = [t.get("function", t).get("name", "?") for t in tools or []]
    say(f"tools the policy can call: {', '.join(names) if names else 'none'}")
    if tools:
        say(json.dumps(tools, indent=1)[:2000])
    closed = env.close()  # type: ignore[attr-defined]
    if inspect.isawaitable(closed):
        asyncio.run(_awaited(closed))


async def _awaited(value: object) -> object:
    return await value  # type: ignore[misc]


def _reward_names(cfg: HoneConfig) -> str:
    parts = cfg.reward.resolved()
    return ", ".join(f"{name} ({c.fn}, weight {c.weight:g})" for name, c in parts.items())

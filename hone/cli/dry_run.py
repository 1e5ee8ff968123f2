"""`hone train --dry-run`: everything a run checks before it trains, then what the model will be asked;
`hone sft|dpo|rm --dry-run` likewise for the offline families (`dry_run_sft`, `dry_run_dpo`, `dry_run_rm`).

It validates the recipe, loads the data (both splits) and the reward, loads the tokenizer, and prints two
training prompts exactly as the policy sees them (chat template and system prompt applied) with their
reference answers; for an environment, the first observation of an episode and the tools the policy can
call. No model weights load and nothing is written, so a wrong field, template or reward shows in seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from transformers import AutoTokenizer

from hone.config import HoneConfig
from hone.envs import release_envs
from hone.envs.base import PlayingEnvironment
from hone.models import resolve_model
from hone.rewards import RewardScorer, reward_failed
from hone.rl.components import recipe_data, recipe_env, recipe_reward
from hone.rollout.prompts import render_prompt
from hone.run.lifecycle import SetupError
from hone.types import Rollout, Sample

SHOWN = 2  # prompts printed
_T = TypeVar("_T")


def dry_run(cfg: HoneConfig, say: Callable[[str], None] = print) -> None:
    """`hone train --dry-run` of a language-model recipe; bad input (a file, a model, an environment's
    arguments, a reward's path) is one line, as a start's set-up makes it."""
    try:
        _dry_run(cfg, say)
    except (ValueError, TypeError, KeyError, OSError, RuntimeError) as e:
        raise SetupError(e.args[0] if e.args else repr(e)) from e


def _dry_run(cfg: HoneConfig, say: Callable[[str], None]) -> None:
    factory = recipe_env(cfg)
    task, train, held_out = recipe_data(cfg, factory)
    scorer = recipe_reward(
        cfg, task, factory
    )  # imports each reward and runs its factory: a bad path fails here
    model_path = resolve_model(cfg.model.path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if factory is None and cfg.rollout.agent is None and train:
        probe_rewards(scorer, train[0], tokenizer, skip=_remote_rewards(cfg))
    say(f"data      {len(train)} training prompts, {len(held_out)} held out for eval")
    say(f"model     {cfg.model.path} (tokenizer from {model_path})")
    say(f"reward    {_reward_names(cfg, scorer)}")
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


def probe_rewards(scorer: RewardScorer, sample: Sample, tokenizer: Any, skip: set[str]) -> None:
    """Call each reward once on the first training prompt, with its reference answer (or an empty string)
    as the response, so a reward that cannot run on the data (a TRL function asking for a column the rows
    lack, a signature that fits neither contract's call) fails here in one line, not at step 0. A reward
    may give any score: only an error counts. `skip`: rewards that call a service (a judge)."""
    text = str(sample.answer) if sample.answer is not None else ""
    ids = tokenizer.encode(text, add_special_tokens=False) or [tokenizer.eos_token_id or 0]
    for component in scorer.components:
        if component.name in skip:
            continue
        probe = Rollout(sample.id, 0, [0, *ids], 1, [1] * len(ids), [0.0] * len(ids), response_text=text)
        one = RewardScorer([replace(component, correctness=False)], timeout_s=scorer.timeout_s)
        scoring_log = logging.getLogger("hone.rewards.scoring")
        level = scoring_log.level
        scoring_log.setLevel(logging.CRITICAL)  # the failure is this function's one line, not a traceback
        try:
            one.score([probe], {sample.id: sample})
        finally:
            scoring_log.setLevel(level)
        if reward_failed(probe) and one.last_error is not None:
            error = one.last_error
            raise SetupError(
                f"reward {component.name!r} failed on training prompt 1 (id {sample.id}) with its reference "
                f"answer as the response: {type(error).__name__}: {error}"
            )


def _remote_rewards(cfg: HoneConfig) -> set[str]:
    return {name for name, c in cfg.reward.resolved().items() if c.fn == "judge"}


def _show_episode_start(env: object, sample: Sample, say: Callable[[str], None]) -> None:
    """The environment's first observation (the messages `reset` returns) and its tools; an environment
    that plays its own episodes (`PlayingEnvironment`) shows none before the model is called."""
    if isinstance(env, PlayingEnvironment):
        say(f"{type(env).__name__} plays its own episodes (play(sample, chat)): nothing before the model")
    else:
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


def _reward_names(cfg: HoneConfig, scorer: RewardScorer) -> str:
    parts = cfg.reward.resolved()
    return ", ".join(
        f"{c.name} ({parts[c.name].fn if c.name in parts else 'the TRL environment get_reward'}, "
        f"weight {c.weight:g})"
        for c in scorer.components
    )


def _fail_as_setup(fn: Callable[[], _T]) -> _T:
    """A model path, tokenizer or row that cannot be encoded: one line, as a start would say it."""

    try:
        return fn()
    except (ValueError, OSError) as e:
        raise SetupError(str(e)) from e


def _run_dir_note(cfg: HoneConfig, command: str) -> str:
    from hone.run.lifecycle import new_run_dir

    run_dir = new_run_dir(cfg.run, command=command)  # a directory holding a run is refused, as at a start
    return f"run dir   {run_dir} (written only by a real start)"


def dry_run_sft(cfg: HoneConfig, say: Callable[[str], None] = print) -> None:
    """`hone sft --dry-run`: the demonstrations (`sft.data` or the task's), the held-out data, the tokenizer
    and the run directory; the first demonstration as it is trained on."""
    from hone.rl.warmstart import sft_pairs

    run_dir = _run_dir_note(cfg, "sft")
    task, held_out = _eval_data_and_reward(cfg)  # validation and the eval after SFT score with them
    scripted = bool(cfg.env.name) and cfg.sft.data is None
    pairs = [] if scripted else _fail_as_setup(lambda: sft_pairs(cfg, task))
    tokenizer = _fail_as_setup(lambda: AutoTokenizer.from_pretrained(resolve_model(cfg.model.path)))
    if tokenizer.eos_token_id is None:
        from hone.run.lifecycle import SetupError

        raise SetupError("SFT needs a tokenizer with an eos token so the model learns to stop")
    source = cfg.sft.data or "the task's demonstrations"
    shown = "the environment's scripted demonstrations" if scripted else f"{len(pairs)} pairs from {source}"
    say(f"data      {shown}; {len(held_out)} problems held out for the eval after SFT")
    say(f"model     {cfg.model.path}")
    say(f"sft       up to {cfg.sft.max_steps} steps of {cfg.sft.batch_size}, lr {cfg.sft.lr:g}")
    say(run_dir)
    if pairs:
        sample, response = pairs[0]
        say("\n--- first demonstration: prompt ---")
        say(render_prompt(sample, tokenizer, cfg.data.chat_template, cfg.data.system_prompt))
        say(f"--- response (trained on): {response!r}")
    say("\ndry run: recipe, demonstrations, data and tokenizer are fine; nothing was trained or written")


def dry_run_dpo(cfg: HoneConfig, say: Callable[[str], None] = print) -> None:
    """`hone dpo --dry-run`: the preference pairs, each encoded with the model's tokenizer (no weights)."""
    from hone.preference.commands import dpo_settings, encode_dpo_pairs, load_pairs

    run_dir = _run_dir_note(cfg, "dpo")
    pairs = load_pairs(cfg.dpo, cfg.dpo.data, "dpo.data")
    settings = dpo_settings(cfg)
    tokenizer = _fail_as_setup(lambda: AutoTokenizer.from_pretrained(resolve_model(cfg.model.path)))
    encoded = _fail_as_setup(lambda: encode_dpo_pairs(cfg, pairs, tokenizer))
    longest = max(max(len(p.chosen[0]), len(p.rejected[0])) for p in encoded)
    say(f"data      {len(pairs)} preference pairs from {cfg.dpo.data} (longest sequence {longest} tokens)")
    say(f"model     {cfg.model.path}")
    s = settings
    say(f"dpo       {s.steps} steps of {s.batch_size}, {s.loss} loss, beta {s.beta:g}, lr {s.lr:g}")
    if cfg.dpo.eval:  # the RL eval before and after: its data and reward
        held_out = _eval_data_and_reward(cfg)[1]
        say(f"eval      {len(held_out)} held-out problems before and after DPO (dpo.eval)")
    say(run_dir)
    _show_pair(cfg, pairs[0], tokenizer, say)
    say("\ndry run: recipe, preference pairs and tokenizer are fine; nothing was trained or written")


def dry_run_rm(cfg: HoneConfig, say: Callable[[str], None] = print) -> None:
    """`hone rm --dry-run`: the training and held-out pairs, each encoded as the reward model scores it."""
    from hone.preference.commands import rm_encoder, rm_pairs, rm_tokenizer

    run_dir = _run_dir_note(cfg, "rm")
    train, held_out = rm_pairs(cfg)
    tokenizer = _fail_as_setup(lambda: rm_tokenizer(resolve_model(cfg.model.path)))
    encode = rm_encoder(cfg, tokenizer)
    _fail_as_setup(lambda: [encode(p) for p in [*train, *held_out]])
    say(f"data      {len(train)} training pairs, {len(held_out)} held out")
    say(f"model     {cfg.model.path} (a new one-logit score head)")
    say(f"rm        {cfg.rm.steps} steps of {cfg.rm.batch_size}, lr {cfg.rm.lr:g}")
    say(run_dir)
    _show_pair(cfg, train[0], tokenizer, say)
    say("\ndry run: recipe, preference pairs and tokenizer are fine; nothing was trained or written")


def _show_pair(cfg: HoneConfig, pair: Any, tokenizer: Any, say: Callable[[str], None]) -> None:
    say("\n--- first pair: prompt ---")
    say(render_prompt(pair.sample, tokenizer, cfg.data.chat_template, cfg.data.system_prompt))
    say(f"--- chosen:   {pair.chosen!r}")
    say(f"--- rejected: {pair.rejected!r}")


def _eval_data_and_reward(cfg: HoneConfig) -> tuple[Any, list[Sample]]:
    """The task and held-out samples the eval reads, and its reward loaded (a bad path fails here)."""
    factory = recipe_env(cfg)
    try:
        task, _, held_out = recipe_data(cfg, factory)
    finally:
        release_envs()
    recipe_reward(cfg, task, factory)
    return task, held_out

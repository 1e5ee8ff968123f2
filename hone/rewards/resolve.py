"""The run's reward, built from its `reward` section: every component's function resolved (a built-in
name, `task`, or a `pkg.mod:fn` plugin), its factory run and its args checked now, so a bad name, arg or
path fails in seconds with one line, before any model loads."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hone.data import Task
from hone.plugins import load_object
from hone.rewards import scoring
from hone.rewards.base import BatchRewardFn, task_reward
from hone.rewards.registry import REWARDS, TEXT_REWARDS
from hone.rewards.scoring import VERIFIER_REWARDS, RewardComponent, RewardScorer
from hone.rewards.trl_contract import TrlReward, contract_line, contract_of
from hone.types import Rollout, Sample
from hone.verifiers.sandbox import set_max_concurrency as set_sandbox_concurrency

if TYPE_CHECKING:
    from hone.config import RewardConfig

log = logging.getLogger("hone")


def load_reward(
    reward: RewardConfig,
    task: Task | None,
    *,
    answer_field: str = "answer",
    max_steps: int = 0,
    env_rewards: Sequence[tuple[str, Callable[..., Any]]] = (),
) -> RewardScorer:
    """Build every reward component (factories run now, so a bad arg or path fails before training).
    `task` is the run's task (`data.task`), which the `task` reward scores with and whose defaults a
    built-in reward's args start from. A `pkg.mod:fn` reward with TRL's contract (`contract_of`) is
    wrapped to be called as TRL calls it; it gets the reference answer as column `answer_field`
    (`data.answer_field`) and `max_steps` (`run.steps`) in its `trainer_state`.

    `env_rewards` are the environment's own reward sources (`(name, TRL-contract function)`: a TRL
    environment's `get_reward`, `hone.envs.trl_env.trl_env_rewards`), added as TRL adds them: a component
    each, weight 1, beside the configured ones; with no reward configured (no `fn`, no `components`) they
    are the reward."""
    if reward.sandbox_concurrency is not None:
        set_sandbox_concurrency(reward.sandbox_concurrency)
    else:  # as many as the reward calls in flight: a call's timeout must not run out waiting for a slot
        set_sandbox_concurrency(reward.max_concurrency)
    # An environment's reward alone is the reward when none is configured (TRL's reward_funcs are optional).
    configured = {} if env_rewards and reward.fn is None and not reward.components else reward.resolved()
    correctness = scoring.correctness_component(
        [*configured, *(name for name, _ in env_rewards)],
        [name for name, c in configured.items() if c.correctness],
        [name for name, c in configured.items() if c.fn in VERIFIER_REWARDS],
    )
    if correctness is None:
        log.warning(
            "no reward component grades correctness (a verifier, or one with correctness: true): "
            "eval/accuracy counts responses whose total reward is full marks"
        )
    components = []
    for name, c in configured.items():
        fn = with_contract(name, c.fn, reward_fn(name, c.fn, c.args, task), c.contract, answer_field)
        components.append(RewardComponent(name, fn, c.weight, c.timeout_s, correctness=name == correctness))
    for name, fn in env_rewards:
        if name in configured:
            raise ValueError(
                f"reward component {name!r} has the name of the TRL environment {name}, whose get_reward is "
                "a component of that name: rename it"
            )
        log.info("reward %s: the TRL environment's get_reward (weight 1, TRL contract)", name)
        fn = TrlReward(name, fn, answer_column=answer_field)
        components.append(RewardComponent(name, fn, correctness=name == correctness))
    scorer = RewardScorer(components, timeout_s=reward.timeout_s, max_concurrency=reward.max_concurrency)
    scorer.trainer_state.max_steps = max_steps
    return scorer


def with_contract(name: str, spec: str, fn: Any, contract: str, answer_field: str = "answer") -> Any:
    """`fn` called by its contract: a `pkg.mod:fn` reward's is read from its signature unless `contract`
    forces it (one log line says which), and a TRL one is wrapped (`TrlReward`); built-in rewards and
    `task` are Hone's."""
    where = f"reward {name!r} (fn {spec!r})"
    if ":" not in spec:
        if contract == "trl":
            raise ValueError(
                f"{where}: a built-in reward has Hone's contract; contract: trl is for 'pkg.mod:fn'"
            )
        return fn
    chosen = contract_of(fn, where, contract)
    log.info(contract_line(name, chosen))
    return TrlReward(name, fn, answer_column=answer_field) if chosen == "trl" else fn


def reward_correctness_component(reward: RewardConfig) -> str | None:
    """The component `eval/accuracy` counts, by the scorer's rule (`correctness_component`): the one
    marked `correctness: true`, else the only one, else the first verifier (task, math, code, env);
    None (the total reward) when there is none."""
    resolved = reward.resolved()
    marked = [name for name, c in resolved.items() if c.correctness]
    verifiers = [name for name, c in resolved.items() if c.fn in VERIFIER_REWARDS]
    return scoring.correctness_component(list(resolved), marked, verifiers)


def reward_fn(name: str, spec: str, args: dict[str, Any], task: Task | None) -> Any:
    """Component `name`'s function: `spec` is `task`, a built-in reward (a factory called with `args`),
    or `pkg.mod:fn` (a reward, or with `args` a factory of one); a one-line `ValueError` otherwise."""
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

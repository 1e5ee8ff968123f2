"""TRL's reward contract, run unchanged: `fn(prompts=, completions=, completion_ids=, **kwargs)`, called
once per batch, returning one `float | None` per completion (TRL 1.16 `GRPOTrainer._calculate_rewards`).

Which contract a `pkg.mod:fn` reward has is read from its signature (`contract_of`): a first parameter
named `completions`, `prompts` or `environments`, or `**kwargs` with no room for Hone's positional
`(rollout, sample)`, is TRL's; `reward.contract` forces either. A TRL function becomes a batched
component (`TrlReward`, one call over the step's rollouts, under the component's timeout) whose keyword
arguments are built as TRL builds them:

- `prompts`: the sample's prompt text, or its message list for a conversational sample (`Sample.messages`);
- `completions`: the response text, or `[{"role": "assistant", "content": text}]` for a conversational one;
- `completion_ids`: the response token ids, as lists;
- every dataset column but the prompt, as lists (one entry per completion): the row's other fields
  (`Sample.meta`) and the reference answer under its column's name (`data.answer_field`, default
  `answer`); a column some rows lack is None in theirs;
- `trainer_state`: a `TrainerState` (`global_step`: the RL step, 0-based, as TRL's before its update;
  `max_steps`: `run.steps`);
- `log_metric(name, value)`: a scalar for the step's metrics.jsonl (values logged twice are averaged);
- `log_extra(column, values)`: one value per completion for samples.jsonl (each record's `extra`);
- `environments`: in an environment run whose environment gives one (`Environment.reward_state`, a TRL
  environment's instance: `hone.envs.trl_env`), each completion's, as its episode left it; else not passed.

A None is "this function does not apply": the completion's reward is the weighted sum over the functions
that returned a value, and one that every function returned None for is unscorable (the scorer flags it,
and training leaves it out as it leaves out a failed reward; TRL's `sum_then_normalize`).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hone.aio import run_coroutine
from hone.types import Rollout, Sample

Contract = Literal["hone", "trl"]
TRL_FIRST = ("completions", "prompts", "environments")
RESERVED = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_metric",
    "log_extra",
    "environments",
)
TRL_LINE = (
    "TRL contract (called once per batch with prompts, completions, completion_ids and the dataset's columns)"
)
HONE_LINE = "Hone contract (called once per response as fn(rollout, sample))"


@dataclass
class TrainerState:
    """What a TRL reward reads as `trainer_state` (the fields of TRL's `TrainerState` Hone knows):
    `global_step`, the RL step being scored (0-based, as TRL's before that step's update), and
    `max_steps`, the run's RL steps (`run.steps`). The producer moves `global_step` each step."""

    global_step: int = 0
    max_steps: int = 0


class LoggedScores(list):
    """A batch's per-completion values (`float | None`) and what the call logged: `metrics`
    (`log_metric`, each name's mean) and `extra` (`log_extra`, column -> one value per completion)."""

    metrics: dict[str, float]
    extra: dict[str, list[Any]]


def _positional(sig: inspect.Signature) -> tuple[list[inspect.Parameter], bool, bool]:
    params = list(sig.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    var_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return positional, var_args, var_kwargs


def contract_of(fn: Any, where: str, forced: str = "auto") -> Contract:
    """`fn`'s contract: `forced` unless "auto", else read from its signature (functions, `functools.partial`
    and callable instances alike); a one-line `ValueError` when the signature fits neither."""
    if forced in ("hone", "trl"):
        return forced  # type: ignore[return-value]
    if hasattr(fn, "score_batch"):  # a batched Hone reward (a reward model)
        return "hone"
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: as before, Hone's
        return "hone"
    positional, var_args, var_kwargs = _positional(sig)
    if positional and positional[0].name in TRL_FIRST:
        return "trl"
    try:
        sig.bind(None, None)  # fn(rollout, sample)
        return "hone"
    except TypeError:
        pass
    if var_kwargs and not var_args:
        return "trl"
    raise ValueError(
        f"{where}: signature {sig} fits neither Hone's contract fn(rollout, sample) nor TRL's "
        "fn(prompts, completions, completion_ids, **kwargs) (a first parameter named completions, "
        "prompts or environments, or **kwargs); set reward.contract to force one"
    )


def contract_line(name: str, contract: Contract) -> str:
    return f"reward {name}: {TRL_LINE if contract == 'trl' else HONE_LINE}"


def _column_value(value: Any) -> Any:
    """A `log_extra` value as samples.jsonl can hold it: JSON scalars as they are, anything else as text."""
    return value if value is None or isinstance(value, str | bool | int | float) else str(value)


@dataclass
class TrlReward:
    """A TRL-contract function as a batched component (`score_batch`, or `ascore_batch` when async)."""

    name: str
    fn: Callable[..., Any]
    state: TrainerState = field(default_factory=TrainerState)
    answer_column: str = "answer"

    @property
    def is_async(self) -> bool:
        call = getattr(type(self.fn), "__call__", None)  # noqa: B004 (a callable instance's method)
        return inspect.iscoroutinefunction(self.fn) or (
            not inspect.isfunction(self.fn) and inspect.iscoroutinefunction(call)
        )

    def score_batch(self, rollouts: Sequence[Rollout], samples: Sequence[Sample]) -> LoggedScores:
        kwargs, out = self._inputs(rollouts, samples)
        values = self.fn(**kwargs)
        if inspect.iscoroutine(values):  # a sync function that returns a coroutine
            values = run_coroutine(values)
        return self._checked(values, len(rollouts), out)

    async def ascore_batch(self, rollouts: Sequence[Rollout], samples: Sequence[Sample]) -> LoggedScores:
        kwargs, out = self._inputs(rollouts, samples)
        return self._checked(await self.fn(**kwargs), len(rollouts), out)

    def _inputs(
        self, rollouts: Sequence[Rollout], samples: Sequence[Sample]
    ) -> tuple[dict[str, Any], LoggedScores]:
        out = LoggedScores()
        out.metrics, out.extra = {}, {}
        logged: dict[str, list[float]] = {}
        n = len(rollouts)

        def log_metric(name: str, value: float) -> None:
            logged.setdefault(name, []).append(float(value))
            out.metrics[name] = sum(logged[name]) / len(logged[name])

        def log_extra(column: str, values: list[Any]) -> None:
            values = list(values)
            if len(values) != n:
                raise ValueError(
                    f"reward {self.name!r}: log_extra({column!r}) got {len(values)} values "
                    f"for {n} completions"
                )
            out.extra[column] = [_column_value(v) for v in values]

        keys = dict.fromkeys(key for s in samples for key in s.meta)  # in the order the rows hold them
        columns = {key: [s.meta.get(key) for s in samples] for key in keys}
        if any(s.answer is not None for s in samples):
            columns[self.answer_column] = [s.answer for s in samples]
        kwargs: dict[str, Any] = {k: v for k, v in columns.items() if k not in RESERVED}
        kwargs["prompts"] = [s.messages if s.messages is not None else s.prompt for s in samples]
        kwargs["completions"] = [
            [{"role": "assistant", "content": r.response_text}] if s.messages is not None else r.response_text
            for r, s in zip(rollouts, samples, strict=True)
        ]
        kwargs["completion_ids"] = [list(r.response_ids) for r in rollouts]
        kwargs["trainer_state"] = self.state
        kwargs["log_metric"] = log_metric
        kwargs["log_extra"] = log_extra
        states = [r.env_state for r in rollouts]
        if any(state is not None for state in states):  # TRL passes them only with an environment_factory
            kwargs["environments"] = states
        return kwargs, out

    def _checked(self, values: Any, n: int, out: LoggedScores) -> LoggedScores:
        try:
            values = list(values)
        except TypeError:
            raise TypeError(
                f"reward {self.name!r} (TRL contract) returned {type(values).__name__}, not a list of "
                f"{n} rewards"
            ) from None
        if len(values) != n:
            raise ValueError(
                f"reward {self.name!r} (TRL contract) returned {len(values)} rewards for {n} completions "
                "(one per completion)"
            )
        for v in values:
            if v is not None and not isinstance(v, numbers.Real):
                raise TypeError(f"reward {self.name!r} returned {type(v).__name__}, not a float or None")
        # TRL reads a NaN as it reads None (its rewards are a NaN-filled tensor): the function does not apply.
        out.extend(None if v is None or math.isnan(v) else float(v) for v in values)
        return out


def trl_metrics(values: dict[str, list[float]]) -> dict[str, float]:
    """`rewards/<name>/mean` and `rewards/<name>/std` of each TRL-contract component, as TRL logs them:
    over the completions it returned a value for (the std of one value is NaN, as TRL's nanstd)."""
    metrics: dict[str, float] = {}
    for name, vs in values.items():
        if vs:
            metrics[f"rewards/{name}/mean"] = mean = sum(vs) / len(vs)
            std = math.sqrt(sum((v - mean) ** 2 for v in vs) / (len(vs) - 1)) if len(vs) > 1 else math.nan
            metrics[f"rewards/{name}/std"] = std
    return metrics

"""TRL environments, unchanged: a class written for TRL 1.16's `GRPOTrainer(environment_factory=...)` runs as
a Hone environment (issue 49).

A TRL environment is a plain class: `reset(**row)` starts an episode from a dataset row's columns and
returns None or a string appended to the last prompt message; every other public method is a tool, its
schema read from its type hints and Google-style docstring (transformers' `get_json_schema`, which both TRL
and `Tool.from_function` use); an optional `get_reward()` (sync or async) scores the finished episode from
the environment's state. A recipe names the class by dotted path (`env.name: mypkg.envs:CounterEnv`): the
instance `make_env` builds is no Hone `Environment` but has a callable `reset`, so it is wrapped here
(one log line says so). Several environments, routed by each row's `environment` column (TRL's dict
`environment_factory`): `env.name: trl` with `env.args.environments: {name: "pkg.mod:Cls", ...}`.

What each side does (docs/coming-from/trl.md, "TRL environments", has the table):

- one instance per episode (TRL pools instances and resets them across steps; Hone builds one per episode,
  so an expensive constructor is paid per episode), built by the zero-argument factory (`env.args` are the
  class's constructor arguments);
- `reset` gets the row as TRL passes it: `prompt` (the text, or the message list), every other column
  (`Sample.meta`), the reference answer under its column's name (`data.answer_field`); in multi-environment
  mode without `environment`; the id and image columns are not passed;
- the model's tool calls (Hermes `<tool_call>` format) run as TRL runs them: a turn's sync tools one
  after another in the order written, then its async tools together; a result is sent back as `str(result)`
  (a list as content parts); a call that raises, names no tool or is malformed gets `{'error': '...'}`;
  sync tools run on worker threads so a slow one does not hold up the other episodes, and every call is cut
  at `tool_timeout_s` (TRL waits for ever);
- a reply without a tool call ends the episode (or `env.max_turns`, TRL's `max_tool_calling_iterations`
  + 1, or the token limits);
- `get_reward` is a reward component named after the class, weight 1, TRL's contract (`trl_env_rewards`,
  added by the run beside `reward`'s components; with no reward configured it is the reward); the
  instance reaches TRL-contract rewards as `environments=` (`reward_state`).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from hone.envs.base import Environment, Message, StepResult, env_class, register_env, resolve_env
from hone.envs.parsers import ToolCall, ToolCallError, ToolCallParser
from hone.envs.tool_env import _TOOL_POOL, ToolEnv
from hone.envs.tools import Tool
from hone.types import Sample

log = logging.getLogger("hone")

RESERVED = ("reset", "get_reward")  # TRL's lifecycle methods: never tools
ROUTE = "environment"  # the row column that picks a multi-environment run's environment (TRL's name)
# TRL's tool schemas of each class, computed once (transformers parses the docstring): {class: {name: schema}}
_SCHEMAS: dict[type, dict[str, dict[str, Any]]] = {}

Factory = Callable[[], Any]


def tool_methods(instance: Any) -> list[Callable[..., Any]]:
    """TRL's tools of an environment instance: the public functions of its class (inherited ones too;
    listed on the class, so no property is evaluated) but `reset` and `get_reward`, bound to it."""
    members = inspect.getmembers(type(instance), predicate=inspect.isfunction)
    return [
        getattr(instance, name) for name, _ in members if name not in RESERVED and not name.startswith("_")
    ]


def _tools(instance: Any, timeout_s: float) -> list[Tool]:
    """The instance's tools, their schemas computed once per class (as TRL renders them: transformers'
    `get_json_schema` of each bound method)."""
    cls = type(instance)
    methods = tool_methods(instance)
    if cls not in _SCHEMAS:
        schemas = {}
        for method in methods:
            try:
                schemas[method.__name__] = Tool.from_function(method).schema
            except ValueError as exc:
                raise ValueError(f"TRL environment {cls.__name__}: {exc}") from None
        _SCHEMAS[cls] = schemas
    tools = []
    for method in methods:
        schema = _SCHEMAS[cls][method.__name__]
        tools.append(
            Tool(method.__name__, schema["function"].get("description", ""), schema, method, timeout_s)
        )
    return tools


def _error(message: str) -> str:
    """What TRL shows the model for a failed call: `str({"error": str(e)})`."""
    return str({"error": message})


@register_env("trl")
class TrlEnv(ToolEnv):
    """A TRL environment class (or several, by name) as a Hone `Environment`.

    `environments` maps names to TRL environment factories (a class, or `pkg.mod:Cls`); the one key None is
    a single environment (what `make_env` builds for a dotted path), any other keys route each row by its
    `environment` column. `answer_column` is the name the row's reference answer came under
    (`data.answer_field`; `make_env` sets it). `reset` and the tools run as TRL runs them (see the
    module)."""

    wraps_trl_environments: ClassVar[bool] = True  # how `make_env` knows it (it cannot import this module)

    reads_answer = False  # `reset` reads the row's columns; no answer column is required

    def __init__(
        self,
        environments: Mapping[str | None, str | Factory],
        answer_column: str = "answer",
        tool_timeout_s: float = 60.0,
        parser: str | ToolCallParser = "hermes",
    ) -> None:
        # TRL has no limit on a turn's calls; the token limits bound them.
        super().__init__(tools=[], parser=parser, max_calls_per_turn=sys.maxsize)
        if not environments:
            raise ValueError(
                "env trl: env.args.environments maps names to TRL environment classes; it is empty"
            )
        if tool_timeout_s <= 0:
            raise ValueError(f"env trl: tool_timeout_s must be > 0, got {tool_timeout_s}")
        self.factories = {name: _factory(name, f) for name, f in environments.items()}
        self.multi = None not in self.factories
        self.answer_column, self.tool_timeout_s = answer_column, tool_timeout_s
        self.instance: Any = None  # this episode's TRL environment
        if not self.multi:  # built now: one instance per episode, as TRL's factory per rollout
            self._build(None)

    @property
    def names(self) -> list[str]:
        return sorted(str(name) for name in self.factories)

    def _build(self, name: str | None) -> None:
        instance = self.factories[name]()
        if not callable(getattr(instance, "reset", None)):
            which = "" if name is None else f"{name!r} "
            raise ValueError(
                f"TRL environment {which}built a {type(instance).__name__} with no callable reset "
                "(environment_factory must build an object with reset(**row))"
            )
        self.instance = instance
        self._tools = {t.name: t for t in _tools(instance, self.tool_timeout_s)}

    def check(self) -> None:
        """Build each environment once (its class, `reset` and tool schemas checked), as TRL does when the
        trainer is made, so a broken one fails when the recipe is set up."""
        for name in self.factories:
            self._build(name)
        if self.multi:
            self.instance, self._tools = None, {}

    def reward_sources(self) -> list[tuple[str, Callable[..., Any]]]:
        """TRL's extra reward sources: one per environment class defining `get_reward`, named after it."""
        sources: dict[type, Callable[..., Any]] = {}
        for name in self.factories:
            self._build(name)
            cls = type(self.instance)
            members = dict(inspect.getmembers(cls, predicate=inspect.isfunction))
            if "get_reward" in members and cls not in sources:
                sources[cls] = env_reward(cls)
        if self.multi:
            self.instance, self._tools = None, {}
        return [(cls.__name__, fn) for cls, fn in sources.items()]

    @classmethod
    def make_samples(cls, n: int, seed: int, split: str, **args: Any) -> list[Sample]:
        """No dataset: TRL's placeholder rows (an empty user message), the environment's `reset` writing the
        task; a multi-environment run needs a dataset with an `environment` column, as in TRL."""
        if "environments" in args:
            raise ValueError(
                "env trl with several environments routes each row by its 'environment' column: give the "
                "recipe a dataset (data.source) with one"
            )
        return [Sample(id=f"trl-{split}-{i}", messages=[{"role": "user", "content": ""}]) for i in range(n)]

    def reset(self, sample: Sample) -> list[Message]:
        # A copy: a group's episodes share their sample, and TRL gives each rollout a row of its own.
        row = copy.deepcopy(sample.meta)
        if sample.answer is not None:
            row[self.answer_column] = sample.answer
        row["prompt"] = copy.deepcopy(sample.messages) if sample.messages is not None else sample.prompt
        if self.multi:
            name = row.pop(ROUTE, None)  # a control column: not passed to reset, as in TRL
            if name not in self.factories:
                known = f"env.args.environments ({', '.join(self.names)})"
                if name is None:
                    raise ValueError(
                        f"sample {sample.id!r} has no 'environment' column to pick one of {known}"
                    )
                raise ValueError(f"sample {sample.id!r}: environment {name!r} is not one of {known}")
            self._build(name)
        observation = self.instance.reset(**row)
        return _appended(_opening(sample), observation, type(self.instance).__name__)

    def finish(self, final_message: str) -> StepResult:
        return StepResult([], done=True)  # the episode's reward is get_reward's and the rewards'

    def reward_state(self) -> Any:
        return self.instance

    async def _run_all(self, calls: list[ToolCall | ToolCallError]) -> list[tuple[str, Any, str]]:
        # TRL calls a turn's sync tools one by one in the order written, then awaits its async ones
        # together: an environment's state sees the calls in that order.
        outcomes: list[tuple[str, Any, str] | None] = [None] * len(calls)
        later = []
        for i, call in enumerate(calls):
            tool = self._tools.get(call.name) if isinstance(call, ToolCall) else None
            if tool is not None and inspect.iscoroutinefunction(tool.fn):
                later.append(i)
            else:
                outcomes[i] = await self._run(call)
        for i, outcome in zip(
            later, await asyncio.gather(*(self._run(calls[i]) for i in later)), strict=True
        ):
            outcomes[i] = outcome
        return [o for o in outcomes if o is not None]

    async def _run(self, call: ToolCall | ToolCallError) -> tuple[str, Any, str]:
        if isinstance(call, ToolCallError):
            return "error", _error(call.message), "error"
        tool = self._tools.get(call.name)
        if tool is None:
            return call.name, _error(f"Tool {call.name} not found."), "error"  # TRL's words
        try:
            if inspect.iscoroutinefunction(tool.fn):
                result = await asyncio.wait_for(tool.fn(**call.arguments), tool.timeout_s)
            else:
                run = functools.partial(tool.fn, **call.arguments)
                pending = asyncio.get_running_loop().run_in_executor(_TOOL_POOL, run)
                result = await asyncio.wait_for(pending, tool.timeout_s)
        except TimeoutError:
            return tool.name, _error(f"{tool.name} timed out after {tool.timeout_s:g} s"), "timeout"
        except Exception as exc:  # TRL's contract: the model reads the error and may retry
            return tool.name, _error(str(exc)), "error"
        # TRL's rendering: a list is content parts (an image beside text), anything else its str()
        return tool.name, result if isinstance(result, list) else str(result), "ok"


def _factory(name: str | None, spec: str | Factory) -> Factory:
    if not isinstance(spec, str):
        return spec
    try:
        target = resolve_env(spec)
    except Exception as exc:
        raise ValueError(f"env.args.environments.{name}: {exc}") from None
    if isinstance(target, type) and issubclass(target, Environment):
        raise ValueError(
            f"env.args.environments.{name}: {spec!r} is a Hone environment; name it as env.name, not here"
        )
    return target


def _opening(sample: Sample) -> list[Message]:
    """The row's prompt as chat messages (a plain-text prompt as one user message, images first)."""
    if sample.messages:
        return [dict(m) for m in sample.messages]
    text = sample.prompt or ""
    images = [{"type": "image"} for _ in sample.images or ()]  # filled with the sample's, in order
    return [{"role": "user", "content": [*images, {"type": "text", "text": text}] if images else text}]


def _appended(messages: list[Message], observation: Any, cls: str) -> list[Message]:
    """TRL's rule: a string from `reset` is appended to the last message's content (a list of parts gets
    it as a text part); None leaves the prompt as it is."""
    if observation is None:
        return messages
    if not isinstance(observation, str | list):
        raise TypeError(f"{cls}.reset returned a {type(observation).__name__}, not None or a string")
    last = messages[-1]
    content = last["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return [*messages[:-1], {**last, "content": content + observation}]


def env_reward(cls: Any) -> Callable[..., Any]:
    """TRL's reward source for an environment class with `get_reward`: a TRL-contract function over the
    batch's `environments`, None for an episode another class played (multi-environment)."""
    if inspect.iscoroutinefunction(cls.get_reward):

        async def get_reward_async(environments: list[Any], **kwargs: Any) -> list[float | None]:
            return [await e.get_reward() if type(e) is cls else None for e in environments]

        get_reward_async.__name__ = cls.__name__
        return get_reward_async

    def get_reward(environments: list[Any], **kwargs: Any) -> list[float | None]:
        return [e.get_reward() if type(e) is cls else None for e in environments]

    get_reward.__name__ = cls.__name__
    return get_reward


def trl_env_rewards(make_env: Callable[[], Environment] | None) -> list[tuple[str, Callable[..., Any]]]:
    """The reward components a run's environment adds (`(name, TRL-contract function)`): each TRL
    environment class's `get_reward`; none for any other environment."""
    env = make_env() if make_env is not None else None
    return env.reward_sources() if isinstance(env, TrlEnv) else []


def is_trl_env(spec: str | None, args: dict[str, Any] | None = None) -> bool:
    """Whether `spec` names TRL environments (`trl`, or a class with a callable `reset` that is no Hone
    `Environment`), read from its class without building one (`env_class`)."""
    cls = env_class(spec, args)
    if cls is None:
        return False
    if issubclass(cls, Environment):
        return issubclass(cls, TrlEnv)
    return callable(getattr(cls, "reset", None))


def trl_env_factory(
    spec: str, cls: Callable[..., Any], args: dict[str, Any], probe: Any, answer_field: str
) -> Callable[[], Environment]:
    """`make_env`'s factory for a spec whose instance `probe` is a TRL environment (`env.name: trl`, or
    a class with a callable `reset` that is no Hone `Environment`); a one-line `ValueError` otherwise."""
    if isinstance(probe, TrlEnv):
        probe.check()
        return functools.partial(cls, **{**args, "answer_column": answer_field})
    if not callable(getattr(probe, "reset", None)):
        raise ValueError(
            f"environment {spec!r} built a {type(probe).__name__}, not an Environment (reset(sample) and "
            "step) nor a TRL environment (reset(**row) and tool methods): it has no reset method"
        )
    factory = functools.partial(TrlEnv, {None: functools.partial(cls, **args)}, answer_column=answer_field)
    env = factory()
    rewards = [name for name, _ in env.reward_sources()]
    log.info(
        "environment %s: TRL environment (reset(**row), tools %s%s)",
        spec,
        ", ".join(env._tools) or "none",
        f", get_reward as reward {rewards[0]}" if rewards else "",
    )
    return factory

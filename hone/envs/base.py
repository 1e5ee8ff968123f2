"""The `Environment` interface, its registry, and `make_env`, which turns a recipe's spec into a factory.

An environment is the other side of a multi-turn conversation: `reset(sample)` gives the initial chat
messages, then each `step(assistant_message)` answers one assistant turn with observation messages, a
reward for that turn, and whether the episode is over. `rollout/multiturn.py` drives it; it never
tokenises anything itself, so one environment works with any chat template.

One instance plays one trajectory: the rollout loop calls the factory from `make_env` once per
trajectory, so an environment may keep its episode state on `self` and never sees another rollout's.
Both methods may be `async` (a tool call that waits on I/O should not block the other rollouts).
`close()` (default: nothing) releases what one episode holds, e.g. a server session; what the instances of
a run share (a server process) is released by `release_envs()` when the run ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from hone.plugins import load_object
from hone.registry import Registry
from hone.types import Sample

Message = dict[str, Any]


@dataclass
class StepResult:
    """What the environment says after one assistant turn.

    `messages` are appended to the conversation (e.g. `{"role": "user", "content": "higher"}` or
    `{"role": "tool", "name": "calculator", "content": "42"}`); ignored once `done`. `reward` is this
    turn's reward. `info` holds numbers the rollout loop sums over the episode into metrics.

    An observation may show images (for a vision-language model): content as a list of parts,
    `{"role": "user", "content": [{"type": "image", "image": <PIL image | bytes | path>}, {"type": "text",
    "text": "..."}]}` (`reset`'s messages too; see `hone.rollout.multiturn` and the `zoom_digit` game).
    """

    messages: list[Message]
    reward: float = 0.0
    done: bool = False
    info: dict[str, float] = field(default_factory=dict)


class Environment(ABC):
    """A multi-turn task. Subclasses implement `reset` and `step`; games also `make_samples` and
    `demonstration`, so a recipe needs no dataset and SFT a warm start."""

    max_turns: int = 8
    # JSON schemas for `tokenizer.apply_chat_template(tools=...)`; None when the model has no tools. Read
    # after `reset`: an environment may choose its tools there (a TRL multi-environment row).
    tools: list[dict] | None = None
    # Whether the environment checks responses against a dataset row's reference answer (`Sample.answer`):
    # then a dataset row without one is refused when the data loads. A TRL environment reads the row's
    # columns itself and needs none.
    reads_answer: ClassVar[bool] = True

    @abstractmethod
    def reset(self, sample: Sample) -> list[Message] | Awaitable[list[Message]]:
        """Start an episode for `sample`; return the initial (system/user) messages."""

    @abstractmethod
    def step(self, assistant_message: str) -> StepResult | Awaitable[StepResult]:
        """Answer one assistant turn."""

    @classmethod
    def make_samples(cls, n: int, seed: int, split: str, **args: Any) -> list[Sample]:
        """`n` samples of a self-contained game; "train" and "eval" splits are disjoint and each is a
        deterministic function of `(n, seed)`. `args` are the environment's constructor arguments
        where they shape the samples (e.g. a game's board size)."""
        raise NotImplementedError(
            f"environment {cls.__name__} does not generate its own samples; give the recipe a dataset"
        )

    def reward_state(self) -> Any:
        """What TRL-contract reward functions get for this episode in `environments=` (TRL's per-completion
        environment instance), taken when the episode ends and kept with its rollout until it is scored.
        None (the default): the run passes no `environments`."""
        return None

    def close(self) -> Awaitable[None] | None:
        """Release what this episode holds (e.g. a server session). The rollout loop calls it once when
        the trajectory ends, however it ended (done, a limit, an error); it may be `async`."""
        return None

    def demonstration(self, sample: Sample) -> list[Message]:
        """A full scripted conversation that solves `sample`: the initial messages, then assistant turns
        and observations, ending with the last assistant turn. Used for the SFT warm start."""
        raise NotImplementedError(f"environment {type(self).__name__} has no scripted demonstration")


class LendsSamples:
    """For an adapter whose problems and SFT demonstrations a game can lend (`env.args.samples`, e.g.
    `guess_number` for its OpenEnv port, `tool_arithmetic` for an MCP calculator; + `samples_args`): the
    game's `make_samples`, `demonstration` and turn limit. Put it before the `Environment` base."""

    _NAME: ClassVar[str] = "this environment"  # the registered name, for messages
    _SAMPLES_HINT: ClassVar[str] = "a game"  # what `env.args.samples` names here, for messages
    _source: Environment | None = None
    max_turns: int

    def _lend(self, samples: str | None, samples_args: dict[str, Any] | None) -> None:
        if samples is None:
            return
        source = resolve_env(samples)(**(samples_args or {}))
        if not isinstance(source, Environment):
            raise ValueError(f"env.args.samples {samples!r} is not an environment")
        self._source = source
        self.max_turns = source.max_turns

    @classmethod
    def make_samples(
        cls,
        n: int,
        seed: int,
        split: str,
        samples: str | None = None,
        samples_args: dict[str, Any] | None = None,
        **args: Any,
    ) -> list[Sample]:
        """`samples`' own `make_samples` with `samples_args` (the run passes every env arg here)."""
        if samples is None:
            raise ValueError(
                f"env {cls._NAME!r} makes no samples of its own: set env.args.samples ({cls._SAMPLES_HINT}) "
                "or give the recipe a dataset (data.source)"
            )
        source: Any = resolve_env(samples)
        return source.make_samples(n, seed, split, **(samples_args or {}))

    def demonstration(self, sample: Sample) -> list[Message]:
        if self._source is None:
            raise ValueError(
                f"env {self._NAME!r} has no demonstrations without env.args.samples (or sft.data)"
            )
        return self._source.demonstration(sample)


# `chat(messages, info) -> reply`: a self-playing environment's one call into the model (see below).
Chat = Callable[[list[Message], dict[str, float]], Awaitable[str]]


class PlayingEnvironment(Environment):
    """An environment whose own code calls the model (an agent harness, a verifiers environment, a
    debate): it implements `play` instead of `reset`/`step`.

    `await chat(messages, info)` sends the policy the conversation's new messages (the first call: the
    opening ones; later calls: what the environment answers the last reply with, and that turn's `info`
    numbers) and returns the policy's next reply. Every call is one turn of the episode: batched with the
    other episodes' turns, recorded token for token, and cut by the run's turn and token limits (a call
    past a limit raises out of `chat`, a `BaseException` that `except Exception` lets pass). `play` returns
    the last turn's result: its reward, info and any closing messages (`done` is implied).
    """

    @abstractmethod
    async def play(self, sample: Sample, chat: Chat) -> StepResult:
        """Play one episode on `sample`, calling the model through `chat`."""

    def reset(self, sample: Sample) -> list[Message]:
        raise TypeError(f"{type(self).__name__} plays itself: the rollout loop calls play(sample, chat)")

    def step(self, assistant_message: str) -> StepResult:
        raise TypeError(f"{type(self).__name__} plays itself: the rollout loop calls play(sample, chat)")


# Set by the rollout loop for each episode's task: `waiting_on_other_episodes` tells it through this.
EPISODE_WAITS: contextvars.ContextVar[Callable[[bool], None] | None] = contextvars.ContextVar(
    "hone_episode_waits", default=None
)


@contextlib.asynccontextmanager
async def waiting_on_other_episodes() -> AsyncIterator[None]:
    """Wrap a wait that only another episode can end (a free server session, released at its close). The
    rollout loop batches the model calls of a step's episodes in lock-step, each batch waiting for every
    live episode; an episode inside this wait is left out of those batches until it ends."""
    waits = EPISODE_WAITS.get()
    if waits is not None:
        waits(True)
    try:
        yield
    finally:
        if waits is not None:
            waits(False)


_RELEASES: list[Callable[[], None]] = []


def register_release(release: Callable[[], None]) -> None:
    """Have `release_envs` call `release` (e.g. the OpenEnv adapter's: stop the servers it started)."""
    _RELEASES.append(release)


def release_envs() -> None:
    """Stop what environments share across a run's instances (server processes); called when a run ends,
    also on an error. Idempotent: an environment built afterwards starts what it needs anew."""
    for release in _RELEASES:
        release()


E = TypeVar("E", bound=type[Environment])
ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment")


def register_env(name: str) -> Callable[[E], E]:
    """Class decorator: make the environment available by `name` in recipes."""

    def add(cls: E) -> E:
        ENVIRONMENTS.register(name)(cls)
        return cls

    return add


# Spec prefixes naming a family of environments an adapter builds (`prefix<id>`), each with the
# `pkg.mod:function(id, args) -> environment class` that builds one; loaded only when a recipe names one
# (the adapters need optional dependencies).
ENV_FAMILIES: Registry[str] = Registry("environment family")
ENV_FAMILIES.add("verifiers:", "hone.envs.verifiers_env:verifiers_env")  # a verifiers environment, by its id


def make_env(
    spec: str, args: dict[str, Any] | None = None, *, answer_field: str = "answer"
) -> Callable[[], Environment]:
    """A zero-argument factory for the environment `spec` (a registered name, `pkg.mod:Class` /
    `pkg.mod.Class`, or `verifiers:<id>`, a verifiers environment: `hone.envs.verifiers_env`) built with
    `args`. One instance is built here, so a bad name or bad arguments fail when the recipe is set up,
    with a `ValueError` naming the environment, not in the first rollout.

    A class (or factory) that builds no `Environment` but an object with a callable `reset` is a TRL
    environment (`GRPOTrainer(environment_factory=...)`): it is wrapped (`hone.envs.trl_env`), and its
    `reset` gets a dataset row's reference answer back under `answer_field` (`data.answer_field`).

    `args` are shared by every instance: environments must treat them as read-only.
    """
    args = dict(args or {})
    family = next((prefix for prefix in ENV_FAMILIES if spec.startswith(prefix)), None)
    if family is not None:
        build = load_object(ENV_FAMILIES[family], what=f"environment {spec!r}")
        cls: Callable[..., Environment] = build(spec.removeprefix(family), args)
    else:
        cls = resolve_env(spec)
    try:
        probe = cls(**args)
    except TypeError as exc:  # a wrong or missing argument: the message names it
        raise ValueError(
            f"environment {spec!r}: cannot construct with env.args {sorted(args)}: {exc}"
        ) from exc
    except ValueError as exc:  # the environment's own check, which names the env.args key
        raise ValueError(f"environment {spec!r}: {exc}") from exc
    if getattr(probe, "wraps_trl_environments", False) or not isinstance(probe, Environment):
        # By name, not an import: `hone.envs.trl_env` builds on this module.
        build = load_object("hone.envs.trl_env:trl_env_factory", what=f"environment {spec!r}")
        return build(spec, cls, args, probe, answer_field)
    return functools.partial(cls, **args)


def env_class(spec: str | None, args: dict[str, Any] | None = None) -> type | None:
    """The class of what `spec` builds, read without building one where it names a class (a factory
    function is called once with `args`); None where that cannot be told (no spec, a family, a bad spec or
    arguments: the run reports those itself, in one line)."""
    if spec is None or any(spec.startswith(prefix) for prefix in ENV_FAMILIES):
        return None
    try:
        target = resolve_env(spec)
        return target if isinstance(target, type) else type(target(**(args or {})))
    except Exception:
        return None


def env_reads_answer(spec: str | None, args: dict[str, Any] | None = None) -> bool:
    """Whether the environment `spec` names checks responses against a row's reference answer
    (`Environment.reads_answer`); a TRL environment class (a callable `reset`, no Hone `Environment`)
    reads the row's columns itself. True where `env_class` cannot tell."""
    cls = env_class(spec, args)
    if cls is None:
        return True
    if issubclass(cls, Environment):
        return cls.reads_answer
    return not callable(getattr(cls, "reset", None))


def resolve_env(spec: str) -> Callable[..., Environment]:
    """The class (or factory) a spec names; `ValueError` naming the spec when there is none."""
    if ":" not in spec and "." not in spec:
        if spec not in ENVIRONMENTS:
            raise ValueError(f"unknown environment {spec!r}; registered: {', '.join(sorted(ENVIRONMENTS))}")
        return ENVIRONMENTS[spec]
    module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")  # or pkg.mod.Class
    target = load_object(f"{module_name}:{attr}", what=f"environment {spec!r}")
    if not callable(target):
        raise ValueError(f"environment {spec!r} is a {type(target).__name__}, not a class or factory")
    return target

"""verifiers environments (Prime Intellect's `verifiers` 0.4, its Environments Hub), played by Hone's sampler.

`env.name: verifiers:<id>` loads the environment with verifiers' own loader (`vf.resolve_env_config`,
`vf.load_environment`): `<id>` is an installed environment package (a Hub id `owner/name[@version]` is
installed as `name`), a built-in verifiers taskset, or a dotted module (`mypkg.envs.units`) exporting its
`vf.Taskset` subclass (and optionally a `vf.Env` subclass) through `__all__`. `env.args` are the taskset
config's fields, validated by verifiers' pydantic config; two keys are Hone's: `eval_args` (field
overrides for the held-out set, e.g. `{split: test}`; without them the held-out set is a hash split of
the taskset's tasks, 10% by task key, and training uses the rest).

What maps to what:
* A task (`vf.TaskData`) is a `Sample`: its system prompt and prompt are the initial messages, the whole
  task data rides in `meta["verifiers_task"]` (as verifiers sends tasks over its own wire). A taskset config
  with a `seed` field gets the run's seed for training and 0 for evaluation, as Hone's built-in games do.
* An episode is verifiers' own: the environment's `setup` / `run(task, agents)` / `finalize` hooks
  (`SingleAgentEnv.run` is one `agents.agent.run(task)`; a multi-turn game drives
  `agents.<seat>.interaction(task)` turn by turn). Departure: verifiers' `Agent` runs a harness program
  in a sandbox that calls the model over HTTP; here the seat is `_Seat`, whose every `turn()` calls
  the model directly (`play(sample, chat)`: `await chat(messages)` is the reply Hone's sampler produced,
  batched with the other episodes' turns, its tokens and log-probs exactly the sampler's). The
  environment plays itself; Hone's rollout loop does not step it.
* The reward is the task's `@vf.reward` functions (and rewards `run`/`finalize` record), scored by
  verifiers itself (`Task.score` on a real `vf.Trace`, whose turns are committed through verifiers'
  message graph); the episode's last `StepResult` carries the trace's weighted sum (`Trace.reward`) and
  each reward unweighted as `info["reward/<name>"]`, which `reward.fn: env` logs as `reward/<name>`.
  `@vf.metric`s become `env/<name>`.
* Image content (`image_url` parts with `data:` URLs, how verifiers sends images, in a task's prompt or an
  observation) becomes `{"type": "image", "image": <bytes>}` parts, which a vision-language model's
  processor expands (`hone.rollout.multiturn`); a task's prompt images go to `Sample.images`. A text model
  refuses them in one line; a remote (http) image URL is refused, not fetched.

Limits: one agent seat per environment (Hone trains one policy on one conversation); no tools (verifiers
serves tools as MCP servers to its harness programs; a taskset or task declaring toolsets is refused at
set-up); no sandboxes (task `setup`/`finalize`/rewards get `runtime=None`; rewards that need one are
skipped by verifiers' own scoring); `@vf.stop` hooks and agent limits are not applied (Hone's
`env.max_turns` / token limits are). A failure of the environment's code (or an episode waiting more
than `STEP_TIMEOUT_S` between turns) is raised from `play` as one line, so the rollout loop
handles it as any environment's: that episode ends, counted in `env/errors` and left out of training;
the run goes on (unless every episode of a batch failed).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import itertools
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, NoReturn

from hone.envs.base import Message, PlayingEnvironment, StepResult
from hone.types import Sample

log = logging.getLogger("hone")

PREFIX = "verifiers:"
STEP_TIMEOUT_S = 60.0  # the most an episode's own code may take between two model turns
EVAL_FRACTION = 0.1  # held-out share of the tasks when `eval_args` is not given
_TASK_KEY = "verifiers_task"
# How the seat reaches the model: the turn's new messages in, the sampled reply out.
Chat = Callable[..., Awaitable[str]]


def verifiers_env(env_id: str, args: dict[str, Any]) -> type[VerifiersEnv]:
    """A `VerifiersEnv` class bound to the verifiers environment `env_id` built with `args`. Every
    set-up failure (verifiers missing, an unknown id, a failing module, bad args, an unsupported kind of
    environment) is one `ValueError` line naming the environment."""
    where = f"environment '{PREFIX}{env_id}'"
    try:
        import verifiers.v1 as vf
        from verifiers.v1.configs.agent import agent_config_fields
    except ImportError as exc:
        raise ValueError(
            f"{where}: needs the verifiers package (pip install -e '.[verifiers]' in a Hone clone): {exc}"
        ) from None
    args = dict(args)
    eval_args = args.pop("eval_args", None)
    if eval_args is not None and not isinstance(eval_args, dict):
        raise ValueError(f"{where}: env.args.eval_args must be a mapping of taskset fields")
    taskset_id = _taskset_id(env_id, where)
    env = _load(vf, taskset_id, args, where)
    if eval_args:
        _load(vf, taskset_id, {**args, **eval_args}, where)  # bad eval_args fail now, not at the first eval
    seats = list(agent_config_fields(env.config))
    if len(seats) != 1:
        raise ValueError(f"{where}: Hone plays environments with one agent seat, this one has {seats}")
    task_cls = type(env.taskset).task_type()
    if type(env.taskset).toolsets(env.taskset.config) or task_cls.toolsets(env.taskset.config.task):
        raise ValueError(
            f"{where}: declares tools (MCP toolsets), which the verifiers adapter does not serve"
        )
    # Stamped on every trace. verifiers computes it per trace, for a PyPI install by running `git` (a
    # subprocess per episode); it cannot change within a run.
    from verifiers import __version__
    from verifiers.v1.utils.version import verifiers_commit

    build = vf.VersionInfo(version=__version__, commit=verifiers_commit())
    # The rubric's names, from the task class's `@vf.reward`s and plugged rewards (no task data needed).
    reward_names = [fn.__name__ for fn in task_cls(None, env.taskset.config.task).hooks("reward")]
    attrs = {
        "env_id": env_id,
        "taskset_id": taskset_id,
        "args": args,
        "eval_args": eval_args,
        "vf_env": env,
        "reward_names": reward_names,
        "build": build,
    }
    return type(f"VerifiersEnv[{env_id}]", (VerifiersEnv,), attrs)


def _taskset_id(env_id: str, where: str) -> str:
    """The id verifiers' loader is given. verifiers 0.4 resolves only top-level module names (for a dotted
    one its `find_spec("verifiers.v1.tasksets.<pkg>....")` raises), so a dotted module is imported here
    and handed over under a top-level alias."""
    if "." not in env_id.rsplit("/", 1)[-1].split("@", 1)[0]:
        return env_id
    try:
        module = importlib.import_module(env_id)
    except Exception as exc:  # a missing module, or the user's module failing as it is imported
        raise ValueError(f"{where}: cannot import {env_id!r}: {type(exc).__name__}: {exc}") from None
    alias = env_id.replace(".", "__")
    sys.modules.setdefault(alias, module)
    return alias


def _load(vf: Any, taskset_id: str, args: dict[str, Any], where: str) -> Any:
    try:
        config = vf.resolve_env_config({"taskset": {**args, "id": taskset_id}})
        return vf.load_environment(config)
    except Exception as exc:  # verifiers raises pydantic, import and its own errors: report each in one line
        raise ValueError(f"{where}: {_one_line(exc)}") from None


def _one_line(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors) and hasattr(exc, "error_count"):  # a pydantic ValidationError: the first problem
        first = errors()[0]
        key = ".".join(str(p) for p in first["loc"] if p != "taskset")
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"env.args.{key}: {first['msg']}{more}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


class VerifiersEnv(PlayingEnvironment):
    """One episode of a verifiers environment; `verifiers_env` makes the subclass bound to one."""

    env_id: ClassVar[str]
    taskset_id: ClassVar[str]
    args: ClassVar[dict[str, Any]]
    eval_args: ClassVar[dict[str, Any] | None]
    vf_env: ClassVar[Any]  # the loaded `vf.Env`; its taskset, task class and hooks are shared, read-only
    reward_names: ClassVar[list[str]]
    build: ClassVar[Any]  # the `vf.VersionInfo` every trace records

    def __init__(self, **args: Any) -> None:
        # `args` built the class's environment already (`verifiers_env`); make_env passes them again.
        pass

    @classmethod
    def make_samples(cls, n: int, seed: int, split: str, **args: Any) -> list[Sample]:
        """The first `n` tasks of the split's taskset: `eval_args` applied for "eval", else a hash split."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        import verifiers.v1 as vf

        where = f"environment '{PREFIX}{cls.env_id}'"
        fields = {**cls.args, **(cls.eval_args or {})} if split == "eval" else dict(cls.args)
        taskset = _load(vf, cls.taskset_id, fields, where).taskset
        if "seed" in type(taskset.config).model_fields:
            taskset.config = taskset.config.model_copy(update={"seed": seed})
        # An infinite taskset whose tasks all hash to the other split would never end: read a bounded stretch.
        stretch = itertools.islice(taskset, 1000 * max(n, 1))
        samples: list[Sample] = []
        try:
            for task in stretch:
                if len(samples) == n:
                    break
                if cls.eval_args is None and _is_eval(task.key) != (split == "eval"):
                    continue
                samples.append(_sample(task, f"verifiers-{split}-{seed}-{len(samples)}"))
        except ImageContentError as exc:
            raise ValueError(f"{where}: {exc}") from None
        except Exception as exc:  # the taskset's own `load()` failing, as it runs
            raise ValueError(f"{where}: its taskset failed to load: {_one_line(exc)}") from None
        if not samples:
            raise ValueError(f"{where}: its taskset has no {split} tasks")
        return samples

    def demonstration(self, sample: Sample) -> list[Message]:
        """A task's own `demonstration()` (a Hone extension verifiers ignores: a scripted solution for the
        SFT warm start), as chat messages."""
        task = self._task(sample)
        demo = getattr(task, "demonstration", None)
        if demo is None:
            return super().demonstration(sample)
        return [dict(m) for m in demo()]

    async def play(self, sample: Sample, chat: Chat) -> StepResult:
        """verifiers' episode on `sample`, its seat's every turn one `chat` call (Hone's rollout loop
        samples it, batched with the other episodes' turns). Its end: the trace's reward and rubric.
        The episode's own code may take at most `STEP_TIMEOUT_S` between two turns."""
        idle_since: list[float | None] = [asyncio.get_running_loop().time()]

        async def turn(messages: list[Message]) -> str:
            idle_since[0] = None  # waiting on the model is not the environment's time
            try:
                return await chat(messages, self._unscored())
            finally:
                idle_since[0] = asyncio.get_running_loop().time()

        episode = asyncio.ensure_future(self._play(self._task(sample), turn))
        try:
            while not episode.done():
                await asyncio.wait({episode}, timeout=1.0)
                since = idle_since[0]
                if since is not None and asyncio.get_running_loop().time() - since > STEP_TIMEOUT_S:
                    self._failed(TimeoutError(f"no turn and no end within {STEP_TIMEOUT_S:g} s"))
            return episode.result()
        finally:
            if not episode.done():
                episode.cancel()
                await asyncio.gather(episode, return_exceptions=True)

    def _unscored(self) -> dict[str, float]:
        """0 for each reward the task declares, on every turn: a part's mean is taken over the rollouts that
        report it, so an episode Hone cut short (a token or turn limit: never scored) must report 0 too.
        `info` sums over the episode, so the scored value adds to these zeros."""
        return {f"reward/{name}": 0.0 for name in self.reward_names}

    def _task(self, sample: Sample) -> Any:
        taskset = self.vf_env.taskset
        task_cls = type(taskset).task_type()
        data = task_cls.data_type().model_validate(sample.meta[_TASK_KEY])
        return task_cls(data, taskset.config.task)

    async def _play(self, task: Any, turn: Chat) -> StepResult:
        """verifiers' episode (`Env.run_episode`'s hooks) with Hone's seat; its end as a `StepResult`."""
        import verifiers.v1 as vf

        env = self.vf_env
        traces: list[Any] = []
        agents = vf.Agents(env.config, lambda name, config: _Seat(name, config, turn, traces, self.build))
        episode = vf.Episode(
            env=vf.EnvInfo(id=env.config.env_id),
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        )
        try:
            await env.setup(agents)
            await env.run(task, agents)
            if not traces:
                raise ValueError(f"{type(env).__name__}.run() ran no agent")
            episode.traces = traces
            await env.finalize(task, episode)
        except Exception as exc:  # the environment's code failed: count it, keep the run going
            return self._failed(exc)
        trace = traces[-1]
        if trace.errors:
            return self._failed(RuntimeError(trace.errors[-1].message))
        info = {f"reward/{name}": r.score for name, r in trace.rewards.items() if r is not None}
        info |= {name: value for name, value in trace.metrics.items() if value is not None}
        return StepResult([], reward=trace.reward, done=True, info=info)

    def _failed(self, exc: BaseException) -> NoReturn:
        # Raised to the rollout loop, which ends this episode, counts it in env/errors, leaves it out of
        # training, logs the batch's first, and stops a batch whose every episode failed (Hone's one path
        # for environment failures, shared with every other environment).
        raise RuntimeError(
            f"verifiers environment {self.env_id!r}: "
            + (_one_line(exc) if isinstance(exc, Exception) else repr(exc))
        ) from exc


def _image_bytes(url: str, where: str) -> bytes:
    """An image `data:` URL's bytes, checked to be an image (its header), or `ImageContentError`."""
    from hone.data.errors import HoneDataError
    from hone.data.images import decode_data_url, resolve_image

    try:
        data: bytes = resolve_image(decode_data_url(url, where), None, where)
    except HoneDataError as exc:
        raise ImageContentError(str(exc)) from None
    return data


def _is_eval(key: str) -> bool:
    digest = hashlib.sha256(f"verifiers\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < EVAL_FRACTION


def _sample(task: Any, sample_id: str) -> Sample:
    from hone.data.images import take_images

    data = task.data
    answer = getattr(data, "answer", None)
    # Images as a data file's are kept: bare `{"type": "image"}` parts in the messages, `images` in order.
    messages, images = take_images([_to_hone(m, sample_id) for m in _opening(data)], f"task {sample_id!r}")
    return Sample(
        id=sample_id,
        messages=messages,
        images=images or None,
        answer=answer if isinstance(answer, str) else None,
        # Every field, defaults included: a message's `role` is a default, and it is what verifiers'
        # message union is discriminated by (`exclude_defaults` dropped it: a list-of-messages prompt
        # then failed to load back).
        meta={_TASK_KEY: data.model_dump(mode="json")},
    )


def _opening(data: Any) -> list[Any]:
    """The task's initial messages as verifiers' harnesses send them: the system prompt, then the prompt."""
    import verifiers.v1 as vf

    prompt = data.prompt
    messages = [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt or [])
    if data.system_prompt is not None:
        messages.insert(0, vf.SystemMessage(content=data.system_prompt))
    return messages


class ImageContentError(ValueError):
    """A task or observation holds image content that cannot be read (one line, naming the task)."""


def _to_hone(message: Any, sample_id: str = "") -> Message:
    """A verifiers message as a Hone one. Image content (OpenAI `image_url` parts with a `data:` URL, as
    verifiers sends images) becomes the HF processor's `{"type": "image", "image": <bytes>}` parts beside
    the text parts, in order, which a vision-language model's processor expands (`hone.rollout.multiturn`);
    a text model refuses them in one line. A remote URL or unreadable image raises `ImageContentError`."""
    import verifiers.v1 as vf
    from verifiers.v1.types import ImageUrlContentPart, TextContentPart, content_text

    content = message.content
    out: Message = {"role": message.role, "content": content_text(content) or ""}
    if isinstance(content, list) and any(isinstance(p, ImageUrlContentPart) for p in content):
        where = f"task {sample_id!r}: a {message.role} message's image" if sample_id else "an image"
        out["content"] = [
            {"type": "text", "text": p.text}
            if isinstance(p, TextContentPart)
            else {"type": "image", "image": _image_bytes(p.image_url.url, where)}
            for p in content
            if isinstance(p, TextContentPart | ImageUrlContentPart)
        ]
    if isinstance(message, vf.ToolMessage) and message.name:
        out["name"] = message.name
    return out


class _Seat:
    """Hone's stand-in for verifiers' `Agent` in one seat (see the module docstring): `run` and
    `interaction` with verifiers' semantics, the model being Hone's (`turn`: messages in, reply out)."""

    def __init__(self, name: str, config: Any, turn: Chat, completed: list[Any], build: Any) -> None:
        self.name, self.config, self.turn, self.completed, self.build = name, config, turn, completed, build
        self.trainable = True

    async def run(self, task: Any, **_: Any) -> Any:
        """One segment on the task's prompt (verifiers' `Agent.run`: a single-turn episode)."""
        async with self.interaction(task) as interaction:
            await interaction.turn()
            interaction.trace.stop("agent_completed")
        return interaction.trace

    @asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> AsyncIterator[_Interaction]:
        import verifiers.v1 as vf
        from verifiers.v1.state import state_cls
        from verifiers.v1.utils.decorators import invoke

        trace = vf.Trace(
            verifiers=self.build,
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=vf.AgentInfo(config=self.config, name=self.name),
        )
        interaction = _Interaction(trace, task, self.turn)
        try:
            await invoke(task.setup, {"trace": trace, "runtime": None})
            yield interaction
            trace.stop("user_closed")  # verifiers' stop condition for an exchange its user ended
            await invoke(task.finalize, {"trace": trace, "runtime": None})
            await task.score(trace)
            trace.ok = True
        except Exception as exc:
            trace.record_error(exc)
            raise
        finally:
            trace.is_completed = True
            self.completed.append(trace)


class _Interaction:
    """verifiers' `Interaction.turn` contract: a prompted task's first turn is a bare `turn()`; each turn
    is committed to the trace's message graph as verifiers commits a model response."""

    def __init__(self, trace: Any, task: Any, chat: Chat) -> None:
        self.trace, self.task, self.chat = trace, task, chat
        self.history: list[Any] = []

    async def turn(self, message: Any = None) -> Any:
        import verifiers.v1 as vf
        from verifiers.v1.dialects import parse_message
        from verifiers.v1.graph import prepare_turn

        prompted = not self.history and self.task.data.prompt is not None
        if message is None and not prompted:
            raise ValueError("a bare turn() takes a prompted task's opening reply; this turn needs a message")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
        if message is None:
            new = _opening(self.task.data)
        elif isinstance(message, str):
            new = [vf.UserMessage(content=message)]
        else:
            new = [parse_message(m) if isinstance(m, dict) else m for m in message]
        if not self.history and self.task.data.system_prompt is not None and message is not None:
            new.insert(0, vf.SystemMessage(content=self.task.data.system_prompt))
        self.history += new
        text = await self.chat([_to_hone(m) for m in new])
        reply = vf.AssistantMessage(content=text)
        response = vf.Response(
            id=f"hone-{len(self.history)}",
            created=int(time.time()),
            model="hone",
            message=reply,
            finish_reason="stop",
        )
        prepare_turn(self.trace, list(self.history)).commit(response)
        self.history.append(reply)
        return vf.Segment(messages=[reply])

"""Multi-agent control: PettingZoo's parallel API as a batch of rows, and the shared actor-critic over them.

`control.env: pettingzoo:<module>` names an importable module with `parallel_env(**control.env_args)`
(`pettingzoo:mpe2.simple_spread_v3`). `ParallelBatch` steps `control.num_envs` copies in a loop and lays
their agents out as extra batch rows, env e's agent a on row e·A + a, so the single-agent loop's
collection (`control_ppo.collect`) and update run on it unchanged: it speaks gymnasium's vector API with
SAME_STEP autoreset (the step that ends an episode returns the next episode's first observation and the
ended one's last in `info["final_obs"]`), and reports each ended episode once, on its first agent's row,
with the team return (the sum over agents) in `info["episode"]`.

A row is what its agent's actor and critic read, side by side: the agent's own observation, then for a
centralised critic (MAPPO, Yu et al. 2022) the joint observation (every agent's, in agent order) and a
one-hot of the agent's index (so one shared critic can tell the agents' rewards apart). With an
independent critic (IPPO, de Witt et al. 2020) a row is the observation alone. Agents share parameters.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

import numpy as np
import torch
from torch.distributions import Distribution

from hone.config import ControlConfig
from hone.control.envs import ControlEnvError, check_spaces
from hone.control.evaluate import EVAL_SEED, action_bounds, as_tensor, play_episodes
from hone.control.normalize import Normalizer
from hone.control.policy import ActorCritic
from hone.control.video import Video

PETTINGZOO = "pettingzoo:"


def is_multi_agent(env: str) -> bool:
    return env.startswith(PETTINGZOO)


def _parallel_env(control: ControlConfig) -> Any:
    """The module's `parallel_env` factory. A missing package (pettingzoo, mpe2) or an unknown module is
    one line, raised before any environment, run directory or model is made."""
    install = "pip install -e '.[marl]' in a Hone clone"
    try:
        importlib.import_module("pettingzoo")
    except ImportError:
        raise ControlEnvError(f"control.env {control.env!r} needs pettingzoo: {install}") from None
    name = control.env.removeprefix(PETTINGZOO)
    package = name.partition(".")[0]
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as e:
        if e.name != package:  # the package is there; one of its own imports is not
            raise ControlEnvError(f"control.env {control.env!r}: cannot import {package!r}: {e}") from None
        if package == "mpe2":
            raise ControlEnvError(f"control.env {control.env!r} needs mpe2: {install}") from None
        raise ControlEnvError(f"control.env {control.env!r}: no module {package!r}") from None
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:  # the package is there, this env is not: name the ones it has
            raise ControlEnvError(
                f"control.env {control.env!r}: no module {name!r}{_siblings(name)}"
            ) from None
        raise ControlEnvError(f"control.env {control.env!r}: cannot import {name!r}: {e}") from None
    except Exception as e:  # the module's own import failed
        raise ControlEnvError(
            f"control.env {control.env!r}: cannot import {name!r}: {type(e).__name__}: {e}"
        ) from None
    if not callable(getattr(module, "parallel_env", None)):
        raise ControlEnvError(f"control.env {control.env!r}: {name} has no parallel_env()")
    return module.parallel_env


def _siblings(name: str) -> str:
    """`; <parent> has: a, b, ...`: the versioned environments (`*_vN`) beside a misspelt module."""
    parent = name.rpartition(".")[0]
    try:
        path = importlib.import_module(parent).__path__
    except (ImportError, AttributeError, ValueError):
        return ""
    envs = sorted(m.name for m in pkgutil.iter_modules(path) if re.search(r"_v\d+$", m.name))
    return f"; {parent} has: {', '.join(envs)}" if envs else ""


class ParallelBatch:
    """`num_envs` copies of a PettingZoo ParallelEnv whose agents share one observation and action space."""

    def __init__(
        self, control: ControlConfig, num_envs: int, centralized: bool, render: bool = False
    ) -> None:
        make = _parallel_env(control)
        args = {**control.env_args, **({"render_mode": "rgb_array"} if render else {})}
        try:
            self.envs = [make(**args) for _ in range(num_envs)]
        except Exception as e:
            raise ControlEnvError(f"control.env {control.env!r}: {type(e).__name__}: {e}") from None
        env = self.envs[0]
        self.agents = list(env.possible_agents)
        spaces = [(env.observation_space(a), env.action_space(a)) for a in self.agents]
        if any(s != spaces[0] for s in spaces):
            raise ControlEnvError(
                f"control.env {control.env!r}: the agents' spaces differ; parameter sharing needs one "
                "observation and one action space"
            )
        check_spaces(control, *spaces[0])
        self.single_action_space = spaces[0][1]
        self.obs_dim = int(spaces[0][0].shape[0])
        agents = len(self.agents)
        self.critic_dim = agents * self.obs_dim + agents if centralized else 0
        self.num_rows = num_envs * agents
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._discrete = hasattr(self.single_action_space, "n")
        self._dtype = self.single_action_space.dtype
        # Each copy's episode k is reset with seed + e + E·k, and the actions since that reset are kept:
        # a checkpoint holds these few numbers (`state_dict`), and a resume replays them into fresh envs
        # (PettingZoo envs do not pickle), which puts every copy where the unbroken run had it.
        self._seed: int | None = None
        self._episode = np.zeros(num_envs, dtype=np.int64)
        self._actions: list[list[Any]] = [[] for _ in range(num_envs)]

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(getattr(self.envs[0], "metadata", {}))

    def render(self) -> Any:
        """The first copy's frame (`render=True`: rgb_array), for eval videos."""
        return self.envs[0].render()

    def _episode_seed(self, e: int) -> int | None:
        return None if self._seed is None else self._seed + e + len(self.envs) * int(self._episode[e])

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Every copy reset (copy e with seed + e): rows [E·A, obs_dim + critic_dim]."""
        self._seed = seed
        self._episode[:] = 0
        obs = [self._reset(e) for e in range(len(self.envs))]
        self._returns[:], self._lengths[:] = 0.0, 0
        return self.rows(np.stack(obs)), {}

    def _reset(self, e: int) -> np.ndarray:
        self._actions[e] = []
        return self._stack(self.envs[e].reset(seed=self._episode_seed(e))[0])

    def state_dict(self) -> dict[str, Any]:
        """What restores every copy mid-episode: the seeds, episode counts, this episode's actions and the
        running team returns (replayed by `load_state_dict`)."""
        if self._seed is None:
            raise ValueError("a multi-agent batch reset without a seed cannot be restored")
        return {
            "seed": self._seed,
            "episode": self._episode.tolist(),
            "actions": self._actions,
            "returns": self._returns.tolist(),
            "lengths": self._lengths.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> np.ndarray:
        """Replay a `state_dict` into these envs; returns the rows to act on next."""
        self._seed = int(state["seed"])
        self._episode[:] = state["episode"]
        obs = []
        for e, actions in enumerate(state["actions"]):
            last = self._reset(e)
            for act in actions:
                step = {
                    a: x if self._discrete else np.asarray(x, dtype=self._dtype)
                    for a, x in zip(self.agents, act, strict=True)
                }
                last = self._stack(self.envs[e].step(step)[0])
            self._actions[e] = [list(act) for act in actions]
            obs.append(last)
        self._returns[:], self._lengths[:] = state["returns"], state["lengths"]
        return self.rows(np.stack(obs))

    def rows(self, obs: np.ndarray) -> np.ndarray:
        """[E, A, D] observations as rows: own observation ‖ (centralised) joint observation ‖ one-hot id."""
        e, a, d = obs.shape
        own = obs.reshape(e * a, d)
        if not self.critic_dim:
            return own.astype(np.float32)
        joint = np.repeat(obs.reshape(e, 1, a * d), a, axis=1).reshape(e * a, a * d)
        return np.concatenate([own, joint, np.tile(np.eye(a), (e, 1))], 1).astype(np.float32)

    def _stack(self, obs: dict[str, Any]) -> np.ndarray:
        return np.stack([np.asarray(obs[a], dtype=np.float32) for a in self.agents])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        a = len(self.agents)
        actions = np.asarray(actions).reshape(len(self.envs), a, *np.shape(actions)[1:])
        shape = (len(self.envs), a)
        reward, terminated, truncated = np.zeros(shape), np.zeros(shape, bool), np.zeros(shape, bool)
        next_obs, final_obs = [], []
        for e, env in enumerate(self.envs):
            act = {
                agent: int(x) if self._discrete else x
                for agent, x in zip(self.agents, actions[e], strict=True)
            }
            self._actions[e].append([x if self._discrete else np.asarray(x).tolist() for x in act.values()])
            obs, rew, term, trunc, _ = env.step(act)
            reward[e] = [rew[agent] for agent in self.agents]
            terminated[e] = [term[agent] for agent in self.agents]
            truncated[e] = [trunc[agent] for agent in self.agents]
            self._returns[e] += reward[e].sum()
            self._lengths[e] += 1
            final = self._stack(obs)
            done = terminated[e] | truncated[e]
            if (done.any() and not done.all()) or (not done.any() and env.agents != self.agents):
                raise ControlEnvError(
                    "multi-agent control: agents that leave mid-episode are not supported yet"
                )
            final_obs.append(final)
            if done.all():
                self._episode[e] += 1
                next_obs.append(self._reset(e))
            else:
                next_obs.append(final)
        ended = terminated | truncated
        info: dict[str, Any] = {"final_obs": self.rows(np.stack(final_obs))}
        first = np.zeros(shape, bool)
        first[:, 0] = ended.all(1)
        if first.any():
            info["episode"] = {
                "r": np.repeat(self._returns, a),
                "l": np.repeat(self._lengths, a),
            }
            info["_episode"] = first.reshape(-1)
            self._returns[ended.all(1)], self._lengths[ended.all(1)] = 0.0, 0
        rows = self.rows(np.stack(next_obs))
        return rows, reward.reshape(-1), terminated.reshape(-1), truncated.reshape(-1), info

    def close(self) -> None:
        for env in self.envs:
            env.close()


class SharedActorCritic(ActorCritic):
    """One actor and one critic for every agent (parameter sharing) over `ParallelBatch` rows: the actor
    reads the row's first `obs_dim` columns (the agent's own observation), the critic the rest when there
    is a rest (centralised), else the same observation (independent)."""

    def __init__(
        self, obs_dim: int, critic_dim: int, action_space: Any, hidden: list[int], activation: str
    ) -> None:
        super().__init__(obs_dim, action_space, hidden, activation, critic_dim=critic_dim or obs_dim)
        self.obs_dim, self.centralized = obs_dim, critic_dim > 0

    def dist(self, obs: torch.Tensor) -> Distribution:
        return super().dist(obs[..., : self.obs_dim])

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return super().value(obs[..., self.obs_dim :] if self.centralized else obs[..., : self.obs_dim])

    def dist_value(self, obs: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        # No shared torso here: the heads read different columns of the row.
        return self.dist(obs), self.value(obs)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return super().act(obs[..., : self.obs_dim], deterministic)


def evaluate_team(
    policy: SharedActorCritic | None,
    control: ControlConfig,
    normalizer: Normalizer | None = None,
    video: Video | None = None,
    step: int = 0,
) -> dict[str, float]:
    """`control.eval_episodes` episodes on fixed seeds (EVAL_SEED + i): the team return (the sum over agents)
    of the deterministic policy (argmax, or the Gaussian's mean), observations normalised with the training
    statistics, frozen. `policy=None` is a uniformly random team (the bench's baseline). With `video`
    (`logging.video`) the first episodes are recorded as videos/step-<step>-episode-<i>.mp4."""
    centralized = control.ppo.multi_agent_critic == "centralized"
    make = lambda render: ParallelBatch(control, 1, centralized, render=render)  # noqa: E731
    env = video.open_env(make) if video else make(False)
    low, high = action_bounds(env.single_action_space)
    rng = np.random.default_rng(EVAL_SEED)

    def act(obs: np.ndarray) -> np.ndarray:
        if policy is None:
            if low is None or high is None:
                return rng.integers(env.single_action_space.n, size=env.num_rows)
            return rng.uniform(low, high, size=(env.num_rows, *low.shape))
        x = as_tensor(obs if normalizer is None else normalizer.observations(obs, update=False))
        with torch.no_grad():
            action = policy.act(x, deterministic=True).numpy()
        return np.clip(action, low, high) if low is not None else action

    return play_episodes(env, control.eval_episodes, act, video, step)

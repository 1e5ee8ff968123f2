"""Checkpoints and `hone train --resume` of a control run (the on-policy, off-policy and offline loops), on
the crash-safe `Checkpointer` every family shares (the run directory, the resume line and the restore are
the run session's: `hone.run.session`).

`runs/<name>/checkpoints/step-N/` (every `run.save_every` RL steps and at the run's end; `run.keep_last`
kept) holds:
- `model/`: `policy.safetensors` and `normalization.json`, what `hone eval --run … --step N` plays;
- `optimizer.pt` (PPO) or `learner.pt` (SAC/TD3: actor, twin critics, target copies, log α and every
  optimizer), `rng.pt` (python, numpy and torch generators);
- `replay/replay.npz` (SAC/TD3): the buffer's filled rows, write position and sampling generator;
- `envs/envs.pkl`: the vector environment itself (every sub-environment's state and generator, the episode
  statistics in flight) and the observation the loop acts on next; a team's envs (PettingZoo, which does
  not pickle) as `envs/team.json`: each copy's episode seed and the actions since, replayed at resume;
- `state.json`: the loop's counters (env steps, the last 100 training episodes, the start eval, its own
  generator) and the normalisation statistics (running means, variances, counts, discounted returns).

So a resumed run takes exactly the steps an unbroken one would (tested: bit-identical weights), also on
MuJoCo (its envs' physics and generators are saved apart: `_restore_physics`). Except where the environments
cannot be saved: an `async` vector env (its sub-environments live in worker processes), or another
`EzPickle` env (Box2D: unpickled as a new env) or one that does not pickle. Then at resume they are reset
with seed `run.seed + 1000 × step`, so the episodes in flight end there (their transitions already in the
buffer stay) and the run goes on as a deterministic function of the checkpoint, not as the unbroken one
would. `envs.pkl` is a pickle: resume only run directories you trust, as with any model file.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file

from hone.config import ControlConfig
from hone.control.evaluate import ControlResult, solved
from hone.control.normalize import Normalizer
from hone.control.policy_io import POLICY_FILE, save_policy
from hone.control.replay import ReplayBuffer
from hone.tracking import MetricsLogger, Progress
from hone.training.checkpoint import RNG, RNG_FILE, Part

if TYPE_CHECKING:
    from hone.run.session import RunSession

log = logging.getLogger("hone")

ENVS_FILE, TEAM_FILE, OBS_FILE, REPLAY_FILE = "envs.pkl", "team.json", "obs.pt", "replay.npz"
RESEED = 1000  # a resumed run whose envs were not saved resets them with run.seed + RESEED × step

# The settings that shape a control run's saved tensors (named when a resume's do not fit).
CONTROL_SHAPES = "control.env, control.hidden_sizes, control.encoder"


@dataclass
class LoopState:
    """What a control loop carries from one RL step to the next, besides its networks and optimizers."""

    envs: Any
    obs: Any  # what the policy acts on next (PPO: the normalised tensor; SAC/TD3: the raw array)
    step: int = 0
    env_steps: int = 0
    vector_steps: int = 0
    episodes: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=100))
    start_eval: dict[str, float] = field(default_factory=dict)
    rng: np.random.Generator | None = None  # SAC/TD3: warm-up actions and TD3's exploration noise
    envs_restored: bool = False
    final_eval: dict[str, float] = field(default_factory=dict)  # the latest eval (this session's)
    stopped_by: str = ""  # why the run ended before its last step ("time limit", "stop_at_return")

    def begin(self, log: Any, evaluate: Callable[[], dict[str, float]]) -> dict[str, float]:
        """The eval before the first step (logged as step 0), or a resumed run's, kept in its checkpoint."""
        if self.step == 0:
            self.start_eval = evaluate()
            log.log(0, self.start_eval)
        return self.start_eval

    def end_step(
        self,
        session: RunSession,
        control: ControlConfig,
        metrics: dict[str, float],
        out: tuple[MetricsLogger, Progress, dict[str, Part]],
        play: Callable[[], dict[str, float]],
        last: bool,
    ) -> bool:
        """The RL step `self.step` ends (`RunSession.end_step`), also at `control.stop_at_return`; True when
        the run ends here."""
        reached = "stop_at_return" if solved(control, self.episodes) else ""
        self.stopped_by, evaluated = session.end_step(self.step, metrics, out, play, last=last, stop=reached)
        self.final_eval = evaluated or self.final_eval or self.start_eval
        return bool(self.stopped_by)

    def result(self, run_dir: Path) -> ControlResult:
        final = self.final_eval or self.start_eval
        return ControlResult(
            run_dir, self.step, self.env_steps, self.start_eval, final, stopped_by=self.stopped_by
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "env_steps": self.env_steps,
            "vector_steps": self.vector_steps,
            "episodes": [list(e) for e in self.episodes],
            "start_eval": self.start_eval,
            "rng": None if self.rng is None else self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.env_steps = int(state["step"]), int(state["env_steps"])
        self.vector_steps = int(state["vector_steps"])
        self.episodes.clear()
        self.episodes.extend((float(r), int(length)) for r, length in state["episodes"])
        self.start_eval = dict(state["start_eval"])
        if self.rng is not None:
            self.rng.bit_generator.state = state["rng"]


class PolicyFolder:
    """`model/`: the acting network and the observation statistics (`hone eval`'s files)."""

    def __init__(self, policy: Any, normalizer: Normalizer | None) -> None:
        self.policy, self.normalizer = policy, normalizer

    def save_pretrained(self, directory: Path) -> None:
        save_policy(self.policy, self.normalizer, directory)

    def load_weights(self, directory: Path) -> None:
        self.policy.load_state_dict(load_file(str(directory / POLICY_FILE)))


class _EnvsFolder:
    """`envs/`: the vector env pickled with the next observation, where that restores it exactly."""

    def __init__(self, state: LoopState) -> None:
        self.state = state

    def save_pretrained(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        if hasattr(self.state.envs, "state_dict"):  # a team's ParallelBatch: replayed, not pickled
            (directory / TEAM_FILE).write_text(json.dumps(self.state.envs.state_dict()))
            torch.save(self.state.obs, directory / OBS_FILE)
            return
        data = _pickled(self.state.envs, self.state.obs)
        if data is not None:
            (directory / ENVS_FILE).write_bytes(data)

    def load_weights(self, directory: Path) -> None:
        team = directory / TEAM_FILE
        if team.is_file():
            self.state.envs.load_state_dict(json.loads(team.read_text()))
            self.state.obs = torch.load(directory / OBS_FILE, weights_only=True)  # as the loop saw it
            self.state.envs_restored = True
            return
        file = directory / ENVS_FILE
        if not file.is_file():
            return
        envs, obs, physics = pickle.loads(file.read_bytes())  # the user's own run directory
        _restore_physics(envs, physics)
        base, fresh = envs.unwrapped, self.state.envs.unwrapped
        base.env_fns = fresh.env_fns  # dropped when pickled (closures); only `SyncVectorEnv` reads them
        self.state.envs.close()
        self.state.envs, self.state.obs, self.state.envs_restored = envs, obs, True


def _pickled(envs: Any, obs: Any) -> bytes | None:
    """The vector env and `obs` as a pickle, or None where it would not restore the env exactly."""
    from gymnasium.utils import EzPickle

    base = envs.unwrapped
    if not hasattr(base, "envs"):  # AsyncVectorEnv: the sub-environments live in worker processes
        return None
    physics: list[tuple[Any, Any, Any] | None] = []
    for env in base.envs:
        inner = env.unwrapped
        if _is_mujoco(inner):  # pickled apart: see `_restore_physics`
            physics.append((inner.model, inner.data, inner.np_random))
        elif isinstance(inner, EzPickle):  # unpickled as a new env from its constructor: its state is lost
            return None
        else:
            physics.append(None)
    fns = base.env_fns
    base.env_fns = None  # `make_vec`'s closures do not pickle, and are not needed after construction
    try:
        return pickle.dumps((envs, obs, physics))
    except Exception as e:
        log.info("control checkpoint: the environments are not saved (%s: %s)", type(e).__name__, e)
        return None
    finally:
        base.env_fns = fns


def _is_mujoco(env: Any) -> bool:
    return type(getattr(env, "data", None)).__module__.startswith("mujoco")


def _restore_physics(envs: Any, physics: list[tuple[Any, Any, Any] | None]) -> None:
    """gymnasium's MuJoCo envs are `EzPickle`s: unpickling builds a fresh env from the constructor's
    arguments, at its initial state. Their state is the `MjModel`, the whole `MjData` (the derived
    quantities too: Ant's reward reads body positions the last step computed) and the generator that draws
    each reset's noise; with these put back the env steps on bit-identically (tested: HalfCheetah, Hopper,
    Walker2d, Ant, Humanoid v5, 3000 steps through resets)."""
    for env, saved in zip(envs.unwrapped.envs, physics, strict=True):
        if saved is not None:
            inner = env.unwrapped
            inner.model, inner.data, inner._np_random = saved


class _ReplayFolder:
    """`replay/`: the replay buffer as one .npz (numpy arrays, no pickle)."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        self.buffer = buffer

    def save_pretrained(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.buffer.save(directory / REPLAY_FILE)

    def load_weights(self, directory: Path) -> None:
        self.buffer.load(directory / REPLAY_FILE)


def checkpoint_parts(
    state: LoopState,
    policy: Any,
    normalizer: Normalizer | None,
    trainer: tuple[str, Any],
    buffer: ReplayBuffer | None = None,
) -> dict[str, Part]:
    """The checkpoint's parts, in load order (the RNG last: building and loading must not draw after it).
    `trainer` is (file name, a `state_dict` holder): PPO's optimizer or SAC/TD3's learner."""
    parts: dict[str, Part] = {"model/": PolicyFolder(policy, normalizer), trainer[0]: trainer[1]}
    if buffer is not None:
        parts["replay/"] = _ReplayFolder(buffer)
    parts["envs/"] = _EnvsFolder(state)
    parts["loop"] = state
    if normalizer is not None:
        parts["normalizer"] = normalizer
    parts[RNG_FILE] = RNG
    return parts


def reseed_if_lost(state: LoopState, seed: int) -> np.ndarray | None:
    """After a resume whose envs were not saved: reset them with a seed derived from the step, and return
    the raw first observations (None when the saved envs were restored)."""
    if state.envs_restored:
        return None
    new_seed = seed + RESEED * state.step
    log.info("control resume: the environments were not saved; reset with seed %d", new_seed)
    return state.envs.reset(seed=new_seed)[0]

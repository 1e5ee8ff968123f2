"""Vector environments for control: gymnasium's vector API, exactly as CleanRL's PPO scripts use it.

`SAME_STEP` autoreset: the step that ends an episode returns the *next* episode's first observation, and
the ended one's last observation in `info["final_obs"]`. gymnasium 1.x's default (`NEXT_STEP`) instead hands
the step after an episode end a fake transition (reward 0, action ignored), which a naive buffer would train
on. Episode statistics come from `RecordEpisodeStatistics` (on the raw rewards); MuJoCo-style
normalisation is the loop's (`hone.control.normalize`).
"""

from __future__ import annotations

from typing import Any

from hone.config import ControlConfig
from hone.errors import HoneError
from hone.plugins import load_object


class ControlEnvError(HoneError, ValueError):
    """An environment that cannot be made or trained: one line naming `control.env`."""


def _gym() -> Any:
    try:
        import gymnasium
    except ImportError:
        raise ControlEnvError(
            "control.env needs gymnasium: pip install -e '.[control]' in a Hone clone"
        ) from None
    return gymnasium


def _env_id(control: ControlConfig) -> Any:
    """A gymnasium id as is; `pkg.mod:Class` registered under a private id so `make_vec` can build it."""
    gym = _gym()
    if ":" not in control.env:
        return control.env
    cls = load_object(control.env, what=f"control.env {control.env!r}")
    env_id = f"hone-user/{control.env.replace(':', '.').replace('.', '-')}-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=cls)
    return env_id


def make_vector_env(control: ControlConfig, seed: int) -> Any:
    """`control.num_envs` environments of `control.env`, reset with `seed` (env i gets seed + i)."""
    gym = _gym()
    env_id = _env_id(control)
    try:
        envs = gym.make_vec(
            env_id,
            num_envs=control.num_envs,
            vectorization_mode=control.vectorization,
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
            **control.env_args,
        )
    except gym.error.Error as e:  # NameNotFound, VersionNotFound, DependencyNotInstalled...
        raise ControlEnvError(f"control.env {control.env!r}: {type(e).__name__}: {e}") from None
    except ImportError as e:
        raise ControlEnvError(f"control.env {control.env!r}: a missing dependency: {e}") from None
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    check_spaces(control, envs.single_observation_space, envs.single_action_space)
    return envs


def make_eval_env(control: ControlConfig) -> Any:
    """One environment for deterministic evaluation (the caller normalises observations with the training
    statistics, frozen)."""
    gym = _gym()
    return gym.make(_env_id(control), **control.env_args)


def check_spaces(control: ControlConfig, observation_space: Any, action_space: Any) -> None:
    """The spaces an MLP actor-critic takes: a flat Box of observations; Discrete or Box actions."""
    spaces = _gym().spaces
    if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 1:
        raise ControlEnvError(
            f"control.env {control.env!r}: observations {observation_space} are not a flat Box; the MLP "
            "policy takes vectors (images and dict observations are not supported yet)"
        )
    if not isinstance(action_space, (spaces.Discrete, spaces.Box)):
        raise ControlEnvError(f"control.env {control.env!r}: actions {action_space} are not Discrete or Box")

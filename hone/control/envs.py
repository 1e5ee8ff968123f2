"""Vector environments for control: gymnasium's vector API, exactly as CleanRL's PPO scripts use it.

`SAME_STEP` autoreset: the step that ends an episode returns the *next* episode's first observation, and
the ended one's last observation in `info["final_obs"]`. gymnasium 1.x's default (`NEXT_STEP`) instead hands
the step after an episode end a fake transition (reward 0, action ignored), which a naive buffer would train
on. Episode statistics come from `RecordEpisodeStatistics` (on the raw rewards); MuJoCo-style
normalisation is the loop's (`hone.control.normalize`). `control.vectorization: envpool` runs envpool's
C++ ports behind the same contract (`hone.control.envpool_env`).

gymnasium 1.x loads no plugins: ids of other packages exist only once their package is imported. Hone
imports the package of a known family itself (highway-env's ids, `ALE/...`), or the module a user names in
`pkg.mod:env-id` (gymnasium's own spelling), and a missing one is one line with its install command.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np

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


# The package that registers (or runs) an id family, and how to install it.
_INSTALL = {
    "highway_env": "pip install -e '.[highway]' in a Hone clone",
    "ale_py": "pip install ale-py",
    "mujoco": 'pip install "gymnasium[mujoco]==1.4.*"',
}
# highway-env 1.x's ids (its __init__ registers them): name without the version.
_HIGHWAY = frozenset(
    {
        "exit",
        "highway",
        "highway-fast",
        "intersection",
        "intersection-multi-agent",
        "lane-keeping",
        "merge",
        "merge-generic",
        "parking",
        "parking-ActionRepeat",
        "parking-parked",
        "racetrack",
        "racetrack-large",
        "racetrack-oval",
        "roundabout",
        "roundabout-generic",
        "two-way",
        "u-turn",
    }
)


def _needs(gym: Any, env_id: str) -> str | None:
    """The optional package `env_id` cannot be made without, if it is one of the known families."""
    try:
        namespace, name, _version = gym.envs.registration.parse_env_id(env_id)
    except gym.error.Error:
        return None  # not an id gymnasium can parse: make_vec says so in its own words
    if namespace == "ALE":
        return "ale_py"
    if namespace is None and name in _HIGHWAY:
        return "highway_env"
    spec = gym.registry.get(env_id)
    entry = spec.entry_point if spec is not None else None
    if isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco"):
        return "mujoco"  # registered by gymnasium itself, but its module imports mujoco on make
    return None


def _import(module: str, control: ControlConfig) -> None:
    hint = _INSTALL.get(module)
    try:
        importlib.import_module(module)
    except ImportError as e:
        install = f": {hint}" if hint else f" ({type(e).__name__}: {e})"
        raise ControlEnvError(f"control.env {control.env!r} needs {module}{install}") from None


def env_id(control: ControlConfig) -> str:
    """The gymnasium id `control.env` names, with the package that registers it imported: an id as is;
    `pkg.mod:env-id` after importing pkg.mod; `pkg.mod:Class` registered under a private id so `make_vec`
    can build it."""
    gym = _gym()
    module, sep, name = control.env.partition(":")
    if sep and name.isidentifier():  # a class; an id has a '-vN' so it is never an identifier
        cls = load_object(control.env, what=f"control.env {control.env!r}")
        private = f"hone-user/{control.env.replace(':', '.').replace('.', '-')}-v0"
        if private not in gym.registry:
            gym.register(private, entry_point=cls)
        return private
    if sep:
        _import(module, control)
    needed = _needs(gym, name if sep else control.env)
    if needed is not None:
        _import(needed, control)
    return name if sep else control.env


def make_vector_env(control: ControlConfig, seed: int) -> Any:
    """`control.num_envs` environments of `control.env`, reset with `seed` (env i gets seed + i)."""
    gym = _gym()
    env = env_id(control)
    if control.vectorization == "envpool":
        from hone.control.envpool_env import check_envpool_id, make_envpool_env

        check_envpool_id(control, env)
        if env not in gym.registry:  # the eval episodes run gymnasium's env of the same id
            raise ControlEnvError(
                f"control.env {control.env!r}: envpool trains it, but gymnasium has no env of that id to "
                "evaluate on"
            )
        envs = make_envpool_env(control, env, seed)
    else:
        try:
            envs = gym.make_vec(
                env,
                num_envs=control.num_envs,
                vectorization_mode=control.vectorization,
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                wrappers=[gym.wrappers.FlattenObservation] if control.flatten_obs else None,
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
    args = control.env_args
    if control.vectorization == "envpool":
        from hone.control.envpool_env import POOL_KEYS

        args = {k: v for k, v in args.items() if k not in POOL_KEYS}
    env = gym.make(env_id(control), **args)
    return gym.wrappers.FlattenObservation(env) if control.flatten_obs else env


def check_spaces(control: ControlConfig, observation_space: Any, action_space: Any) -> None:
    """The spaces an MLP actor-critic takes: a flat Box of observations; Discrete or Box actions."""
    spaces = _gym().spaces
    if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 1:
        raise ControlEnvError(
            f"control.env {control.env!r}: observations {observation_space} are not a flat Box; the MLP "
            "policy takes vectors (control.flatten_obs: true flattens a small array such as highway-env's; "
            "images and dict observations are not supported yet)"
        )
    if not isinstance(action_space, (spaces.Discrete, spaces.Box)):
        raise ControlEnvError(f"control.env {control.env!r}: actions {action_space} are not Discrete or Box")


def episode_end_infos(
    control: ControlConfig, info: dict[str, Any], ended: np.ndarray, keys: Sequence[str]
) -> list[dict[str, float]]:
    """`keys` of the last step's info of each episode that ended in this vector step (SAME_STEP puts the
    ended episode's info in `info["final_info"]`; the step's own info is the next episode's reset's)."""
    if not keys or not ended.any():
        return []
    final = info.get("final_info", {})
    missing = [k for k in keys if k not in final]
    if missing:
        raise ControlEnvError(
            f"control.episode_info_keys {missing}: not in the info of {control.env!r}'s last step "
            f"(it has {sorted(k for k in final if not k.startswith('_'))})"
        )
    return [{k: float(final[k][i]) for k in keys} for i in np.flatnonzero(ended)]

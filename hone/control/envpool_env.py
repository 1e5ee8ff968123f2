"""envpool as a vector-env backend (`control.vectorization: envpool`), adapted to the contract of
`make_vector_env`: gymnasium's `SAME_STEP` autoreset.

envpool (1.2.5 checked) resets an ended environment on the *next* step (`AutoresetMode.NEXT_STEP`, in its
metadata): that step ignores the action and returns the new episode's first observation with reward 0 and
neither flag set, a transition that never happened. `SameStepEnvpool` instead resets the ended
environments at once (envpool's `reset(env_id)` of a subset, which its sync mode allows), puts their reset
observation in the returned batch and the ended episode's last observation in `info["final_obs"]`, its info
in `info["final_info"]`, as gymnasium's vector envs do under `SAME_STEP`. An envpool env that was reset this
way steps normally on the next call (its `elapsed_step` restarts at 1).
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from hone.config import ControlConfig
from hone.control.errors import ControlEnvError

INSTALL = "pip install -e '.[envpool]' in a Hone clone"
# envpool.make's keys about the pool, not the task: the eval env (gymnasium's) does not take them.
POOL_KEYS = frozenset({"num_threads", "batch_size", "thread_affinity_offset", "max_num_players"})


def _envpool(what: str) -> Any:
    try:
        import envpool
    except ImportError:
        raise ControlEnvError(f"{what} needs envpool: {INSTALL}") from None
    return envpool


def check_envpool_id(control: ControlConfig, env_id: str) -> None:
    """envpool runs only the ids it ships (its C++ ports): anything else is one line, before any env."""
    what = f"control.vectorization envpool (control.env {control.env!r})"
    envpool = _envpool(what)
    if env_id not in envpool.list_all_envs():
        raise ControlEnvError(
            f"{what}: not an envpool id (envpool.list_all_envs(); envpool runs its own C++ ports only, "
            "not gymnasium's registry); use control.vectorization: sync"
        )


def make_envpool_env(control: ControlConfig, env_id: str, seed: int) -> SameStepEnvpool:
    """`control.num_envs` envpool environments of `env_id` (seeded with `seed` at creation), SAME_STEP."""
    envpool = _envpool("control.vectorization envpool")
    with warnings.catch_warnings():  # its Box spaces cast float64 bounds to float32, with a warning each
        warnings.simplefilter("ignore", UserWarning)
        pool = envpool.make(
            env_id,
            env_type="gymnasium",
            num_envs=control.num_envs,
            seed=seed,
            # One worker thread unless env_args says more: the loop steps all envs at once and waits.
            **{"num_threads": 1, **control.env_args},
        )
        return SameStepEnvpool(pool, flatten=control.flatten_obs)  # (its spaces are made here)


class SameStepEnvpool(gym.vector.VectorEnv):
    """An envpool pool behind gymnasium's vector API with SAME_STEP autoreset (see the module doc)."""

    def __init__(self, pool: Any, flatten: bool) -> None:
        self.pool, self.flatten = pool, flatten
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self.num_envs = pool.num_envs
        space = pool.single_observation_space
        if flatten:
            space = gym.spaces.flatten_space(space)
        self.single_observation_space = space
        self.single_action_space = pool.single_action_space
        self.observation_space = gym.vector.utils.batch_space(space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        return obs.reshape(len(obs), -1) if self.flatten else obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        # envpool's seeds are fixed at creation (make_envpool_env's seed); a seed here is that one.
        obs, info = self.pool.reset()
        return self._obs(_by_env(obs, info)), info

    def step(self, actions: Any) -> Any:
        obs, reward, terminated, truncated, info = self.pool.step(np.asarray(actions))
        order = np.argsort(info["env_id"])  # sync mode returns env order; sorted to be certain
        # (fancy indexing copies: envpool may reuse its buffers on the reset below)
        obs, reward, terminated, truncated = (x[order] for x in (obs, reward, terminated, truncated))
        ended = np.logical_or(terminated, truncated)
        if ended.any():
            ids = np.flatnonzero(ended)
            final_obs = np.empty(self.num_envs, dtype=object)  # gymnasium's layout: None where live
            for i in ids:
                final_obs[i] = self._obs(obs[i : i + 1])[0].copy()
            info["final_obs"], info["_final_obs"] = final_obs, ended
            info["final_info"], info["_final_info"] = _select(info, order), ended
            reset_obs, reset_info = self.pool.reset(ids.astype(np.int32))
            obs[reset_info["env_id"]] = reset_obs
        return self._obs(obs), reward, terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        self.pool.close()


def _by_env(obs: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    return obs[np.argsort(info["env_id"])]


def _select(info: dict[str, Any], order: np.ndarray) -> dict[str, Any]:
    """The per-env arrays of envpool's info, in env order (what `final_info` holds for the ended ones)."""
    return {
        k: v[order]
        for k, v in info.items()
        if isinstance(v, np.ndarray) and v.shape[:1] == order.shape and not k.startswith("_")
    }

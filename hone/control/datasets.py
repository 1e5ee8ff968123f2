"""Offline data as Minari datasets (Farama's standard): read with `data.source: minari:<id>`, written by
`hone collect`, so a dataset Hone writes is read by Minari's own tools (`minari.load_dataset(id)` with
`MINARI_DATASETS_PATH` = the root) and a Minari dataset a user already has is read by Hone.

A Minari episode holds T+1 observations (the last is the final one, also at a time-limit truncation), T
actions, rewards, terminations and truncations. Transitions are (o_t, a_t, r_t, o_{t+1}, terminated_t):
only a true termination stops bootstrapping (a truncated episode's last transition bootstraps from its
final observation, as the online replay buffer does). Actions are stored in the environment's units;
`load_offline` rescales them to the [-1, 1] the networks use.

Writing goes through `minari.create_dataset_from_buffers`, which needs no jax (Minari's `DataCollector`
pulls jax, ~380 MB); reading needs a storage backend, `minari[arrow]` (the `offline` extra)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hone.control.errors import ControlEnvError

PREFIX = "minari:"
INSTALL = "pip install 'hone[offline]' (minari with its arrow storage)"


@dataclass
class Transitions:
    """Rows of (obs, actions in [-1, 1], rewards, next_obs, terminated) of whole episodes."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    episodes: int

    def __len__(self) -> int:
        return len(self.rewards)


@dataclass
class OfflineDataset:
    dataset_id: str
    train: Transitions
    holdout: Transitions | None  # episodes held out by id (`control.offline.holdout`): the val/ metrics
    initial_obs: np.ndarray  # each held-out (else each) episode's first observation: FQE's start states
    returns: np.ndarray  # each episode's undiscounted return: the behaviour policy's score
    ref_min_score: float | None
    ref_max_score: float | None

    def normalized_score(self, episode_return: float) -> float | None:
        """D4RL's normalisation (Fu et al. 2020), as Minari's `get_normalized_score`:
        100 · (return - ref_min) / (ref_max - ref_min); none without both reference scores."""
        if self.ref_min_score is None or self.ref_max_score is None:
            return None
        return 100.0 * (episode_return - self.ref_min_score) / (self.ref_max_score - self.ref_min_score)


def dataset_id(source: str) -> str:
    if not source.startswith(PREFIX) or len(source) == len(PREFIX):
        raise ControlEnvError(
            f"data.source {source!r}: an offline control algorithm reads a Minari dataset, minari:<id> "
            "(e.g. minari:hone/pendulum/medium-v0)"
        )
    return source[len(PREFIX) :]


def minari_module(what: str) -> Any:
    """`minari`, with a storage backend to read and write: a missing extra is one line naming `what`."""
    try:
        minari = importlib.import_module("minari")
    except ImportError:
        raise ControlEnvError(f"{what}: Minari is not installed: {INSTALL}") from None
    if importlib.util.find_spec("pyarrow") is None and importlib.util.find_spec("h5py") is None:
        raise ControlEnvError(f"{what}: Minari has no storage backend (pyarrow or h5py): {INSTALL}")
    return minari


def datasets_root(root: str | None) -> Path:
    """`control.offline.dataset_root`, else Minari's own: MINARI_DATASETS_PATH or ~/.minari/datasets."""
    if root is not None:
        return Path(root).expanduser().resolve()
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env).expanduser() if env else Path.home() / ".minari" / "datasets"


def load_offline(
    source: str,
    *,
    root: str | None,
    observation_space: Any,
    action_space: Any,
    holdout: float = 0.0,
) -> OfflineDataset:
    """The dataset `source` (minari:<id>) under `root` as transitions for the environment with these
    spaces; episodes split into train and held-out by id. Every failure is one line naming the dataset."""
    name = dataset_id(source)
    where = f"data.source {source}"
    minari = minari_module(where)
    folder = datasets_root(root) / name
    if not (folder / "data").is_dir():
        if root is None and os.environ.get("MINARI_DATASETS_PATH") is None:
            folder = _download(minari, name, where, folder)
        else:
            raise ControlEnvError(
                f"{where}: no Minari dataset {name} under {datasets_root(root)} (write one with "
                "`hone collect`; list them with `minari list local`)"
            )
    try:
        data = minari.MinariDataset(str(folder / "data"))
    except Exception as e:  # a damaged or foreign folder: whatever Minari raises, one line
        raise ControlEnvError(f"{where}: {folder} is not a readable Minari dataset: {_short(e)}") from None
    _check_spaces(where, data.spec.observation_space, observation_space, "observation")
    _check_spaces(where, data.spec.action_space, action_space, "action")
    if data.total_episodes == 0 or data.total_steps == 0:
        raise ControlEnvError(f"{where}: the dataset is empty (no episodes)")
    low = np.asarray(action_space.low, np.float32).reshape(-1)
    high = np.asarray(action_space.high, np.float32).reshape(-1)
    kept: list[Any] = []
    held: list[Any] = []
    try:  # episodes are read here, file by file: a truncated or damaged one fails now, in one line
        for episode in data.iterate_episodes():
            (held if _held_out(int(episode.id), holdout) else kept).append(episode)
    except Exception as e:
        raise ControlEnvError(f"{where}: {folder} has an unreadable episode: {_short(e)}") from None
    if not kept:  # a tiny dataset: everything trains
        kept, held = held, []
    meta = data.storage.metadata
    return OfflineDataset(
        dataset_id=name,
        train=_transitions(kept, low, high),
        holdout=_transitions(held, low, high) if held else None,
        initial_obs=np.stack([np.asarray(e.observations[0], np.float32) for e in held or kept]),
        returns=np.array([float(np.sum(e.rewards)) for e in kept + held]),
        ref_min_score=_optional_float(meta.get("ref_min_score")),
        ref_max_score=_optional_float(meta.get("ref_max_score")),
    )


def _download(minari: Any, name: str, where: str, folder: Path) -> Path:
    """A Minari-hub id where the network allows (`minari[hf]`): downloaded into Minari's data path."""
    try:
        minari.load_dataset(name, download=True)
    except Exception as e:
        raise ControlEnvError(
            f"{where}: no Minari dataset {name} under {folder.parent} and no download: {_short(e)}"
        ) from None
    return folder


def _check_spaces(where: str, data_space: Any, env_space: Any, what: str) -> None:
    shape, env_shape = getattr(data_space, "shape", None), getattr(env_space, "shape", None)
    same = type(data_space) is type(env_space) and shape == env_shape
    if same and hasattr(env_space, "low"):
        same = bool(
            np.allclose(data_space.low, env_space.low) and np.allclose(data_space.high, env_space.high)
        )
    if not same:
        raise ControlEnvError(
            f"{where}: the dataset's {what} space {data_space} does not match the environment's {env_space} "
            "(control.env)"
        )


def _held_out(episode_id: int, share: float) -> bool:
    """A fixed pseudo-random choice by id (Knuth's multiplicative hash), the same on every load."""
    return share > 0 and (episode_id * 2654435761 % 2**32) / 2**32 < share


def _transitions(episodes: list[Any], low: np.ndarray, high: np.ndarray) -> Transitions:
    obs = [np.asarray(e.observations, np.float32).reshape(len(e.observations), -1) for e in episodes]
    actions = np.concatenate(
        [np.asarray(e.actions, np.float32).reshape(len(e.actions), -1) for e in episodes]
    )
    return Transitions(
        obs=np.concatenate([o[:-1] for o in obs]),
        actions=np.clip((actions - (high + low) / 2) / ((high - low) / 2), -1.0, 1.0).astype(np.float32),
        rewards=np.concatenate([np.asarray(e.rewards, np.float32) for e in episodes]),
        next_obs=np.concatenate([o[1:] for o in obs]),
        terminated=np.concatenate([np.asarray(e.terminations, np.float32) for e in episodes]),
        episodes=len(episodes),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


@dataclass
class Episode:
    """One recorded episode: T+1 observations, T actions (env units), rewards, terminations, truncations."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    seed: int | None = None


@contextlib.contextmanager
def _root_env(root: Path) -> Iterator[None]:
    """Minari writes under MINARI_DATASETS_PATH, read when it writes: set for the call, then restored."""
    before = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root.resolve())  # Minari joins a relative one twice
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = before


def check_new_dataset(name: str, root: Path) -> Path:
    """The folder dataset `name` would be written to under `root`; one line when it exists (checked before
    any episode is recorded, and again before writing)."""
    folder = root / name
    if folder.exists():
        raise ControlEnvError(
            f"--dataset-id {name}: {folder} exists; choose another id or version (-v1), or delete it"
        )
    return folder


def write_dataset(
    name: str,
    episodes: list[Episode],
    *,
    root: Path,
    env: Any,
    algorithm_name: str,
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
    description: str | None = None,
) -> Path:
    """`episodes` as the Minari dataset `name` under `root` (arrow storage); `env` the gymnasium env they
    were played in (its spec, with its kwargs, is saved so `recover_environment` remakes it). Refuses to
    replace an existing dataset. Returns its folder."""
    where = f"--dataset-id {name}"
    minari = minari_module(where)
    folder = check_new_dataset(name, root)
    if not episodes:
        raise ControlEnvError(f"{where}: no episodes to write")
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers = [
        EpisodeBuffer(
            id=i,
            seed=e.seed,
            observations=e.observations,
            actions=e.actions,
            rewards=list(e.rewards),
            terminations=list(e.terminations),
            truncations=list(e.truncations),
            infos={},
        )
        for i, e in enumerate(episodes)
    ]
    spec = getattr(env, "spec", None)
    # Without a spec (an env outside gymnasium's registry) Minari needs the spaces themselves.
    spaces = (
        {}
        if spec is not None
        else {"observation_space": env.observation_space, "action_space": env.action_space}
    )
    with _root_env(root), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Minari's "author_email is None" advice
        minari.create_dataset_from_buffers(
            name, buffers, env=spec, algorithm_name=algorithm_name, author="hone collect",
            ref_min_score=ref_min_score, ref_max_score=ref_max_score, description=description,
            data_format="arrow" if importlib.util.find_spec("pyarrow") else "hdf5", **spaces,
        )  # fmt: skip
    return folder

"""Vector environments for control: gymnasium's vector API, exactly as CleanRL's PPO scripts use it.

`SAME_STEP` autoreset: the step that ends an episode returns the *next* episode's first observation, and
the ended one's last observation in `info["final_obs"]`. gymnasium 1.x's default (`NEXT_STEP`) instead hands
the step after an episode end a fake transition (reward 0, action ignored), which a naive buffer would train
on. Episode statistics come from `RecordEpisodeStatistics` (on the raw rewards); MuJoCo-style
normalisation is the loop's (`hone.control.normalize`). `control.vectorization: envpool` runs envpool's
C++ ports behind the same contract (`hone.control.envpool_env`).

gymnasium 1.x loads no plugins: ids of other packages exist only once their package is imported. Hone
imports the package of a known family itself (highway-env's ids, ale-py's), or the module a user names in
`pkg.mod:env-id` (gymnasium's own spelling), and a missing one is one line with its install command.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import signal
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hone.config import ControlConfig
from hone.control.errors import ControlEnvError
from hone.plugins import load_object


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
    env = name if sep else control.env
    if env.startswith("ALE/") or env not in gym.registry:
        _register_ale(control)
    needed = _needs(gym, env)
    if needed is not None:
        _import(needed, control)
    return env


def _register_ale(control: ControlConfig) -> None:
    """ale-py's ids (ALE/Pong-v5, PongNoFrameskip-v4) exist once ale-py registers them."""
    try:
        import ale_py
    except ImportError:
        if control.env.startswith("ALE/") or control.atari:
            raise ControlEnvError(
                f"control.env {control.env!r} needs ale-py (and opencv for the preprocessing): "
                "pip install -e '.[atari]' in a Hone clone"
            ) from None
        return
    _gym().register_envs(ale_py)


def _atari(control: ControlConfig, env_id: str) -> tuple[dict[str, Any], int] | None:
    """With Atari preprocessing (`control.atari`, or an ale-py id when null): the env's keyword arguments
    and the frames `AtariPreprocessing` skips. It skips 4 with a max-pool, so the ALE skips none
    (`frameskip=1` unless the recipe sets it; a recipe's frameskip > 1 leaves the skipping to the ALE)."""
    spec = _gym().registry.get(env_id)
    ale = spec is not None and str(spec.entry_point).startswith("ale_py")
    if control.atari and not ale:
        raise ControlEnvError(
            f"control.atari: true needs an ale-py environment; control.env {control.env!r} is not"
        )
    if not (ale if control.atari is None else control.atari):
        return None
    from hone.control.atari import FRAME_SKIP

    args = {"frameskip": 1, **control.env_args}
    return args, FRAME_SKIP if args["frameskip"] == 1 else 1


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
        if _atari(control, env) is not None:
            raise ControlEnvError(
                f"control.env {control.env!r}: Atari preprocessing is gymnasium's (control.vectorization: "
                "sync or async); envpool's Atari ids are not supported"
            )
        return _checked(
            control, gym.wrappers.vector.RecordEpisodeStatistics(make_envpool_env(control, env, seed))
        )
    atari = _atari(control, env)
    env_args, wrappers = control.env_args, None
    if atari is not None:
        from hone.control import atari as atari_wrappers

        env_args, wrappers = atari[0], atari_wrappers.wrappers(atari[1], training=True)
    elif control.flatten_obs:
        wrappers = [gym.wrappers.FlattenObservation]
    try:
        with _workers_leave_signals_to_the_run():
            envs = gym.make_vec(
                env,
                num_envs=control.num_envs,
                vectorization_mode=control.vectorization,
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                wrappers=wrappers,
                **env_args,
            )
    except gym.error.Error as e:  # NameNotFound, VersionNotFound, DependencyNotInstalled...
        raise ControlEnvError(f"control.env {control.env!r}: {type(e).__name__}: {e}") from None
    except ImportError as e:
        raise ControlEnvError(f"control.env {control.env!r}: a missing dependency: {e}") from None
    if atari is not None:  # whole-game statistics, recorded under the life and reward wrappers
        return _checked(control, atari_wrappers.GameEpisodes(envs))
    return _checked(control, gym.wrappers.vector.RecordEpisodeStatistics(envs))


def _checked(control: ControlConfig, envs: Any) -> Any:
    check_spaces(control, envs.single_observation_space, envs.single_action_space)
    return envs


def make_eval_env(control: ControlConfig, render: bool = False) -> Any:
    """One environment for deterministic evaluation (the caller normalises observations with the training
    statistics, frozen); `render`: with `render_mode="rgb_array"` for `logging.video`. Atari: whole games,
    raw scores, the training preprocessing otherwise."""
    gym = _gym()
    env = env_id(control)
    atari = _atari(control, env)
    env_args = control.env_args if atari is None else atari[0]
    if control.vectorization == "envpool":  # envpool.make's pool keys are not the task's
        from hone.control.envpool_env import POOL_KEYS

        env_args = {k: v for k, v in env_args.items() if k not in POOL_KEYS}
    if render:
        env_args = {**env_args, "render_mode": "rgb_array"}
    made = gym.make(env, **env_args)
    if atari is None:
        return gym.wrappers.FlattenObservation(made) if control.flatten_obs else made
    from hone.control import atari as atari_wrappers

    skip = atari[1] * int(env_args["frameskip"]) if isinstance(env_args["frameskip"], int) else atari[1]
    for wrap in atari_wrappers.wrappers(atari[1], training=False):
        made = wrap(made)
    # One rendered frame per action: the video plays in real time at the ALE's 60 Hz / frames skipped.
    made.metadata = {**made.metadata, "render_fps": atari_wrappers.ALE_HZ / skip}
    return made


def check_spaces(control: ControlConfig, observation_space: Any, action_space: Any) -> None:
    """The spaces the actor-critic takes: a flat Box (the MLP) or a uint8 channels-first image Box (the
    CNN, `control.encoder`); Discrete or Box actions."""
    from hone.control.encoders import CNN_MIN_SIZE, encoder_kind, is_image

    spaces = _gym().spaces
    where = f"control.env {control.env!r}"
    kind = encoder_kind(control, observation_space)
    box = isinstance(observation_space, spaces.Box)
    if kind == "mlp" and (not box or len(observation_space.shape) != 1):
        hint = "use control.encoder: cnn" if is_image(observation_space) else _image_hint(observation_space)
        raise ControlEnvError(
            f"{where}: observations {observation_space} are not a flat Box, which the MLP policy takes "
            f"({hint})"
        )
    if kind == "cnn":
        if not box or not is_image(observation_space):
            raise ControlEnvError(
                f"{where}: control.encoder cnn takes uint8 images (channels, height, width); observations "
                f"{observation_space} are not ({_image_hint(observation_space)})"
            )
        channels, height, width = observation_space.shape
        if channels > min(height, width):
            raise ControlEnvError(
                f"{where}: observations of shape {observation_space.shape} look channels-last; the CNN takes "
                "(channels, height, width) (Atari ids: control.atari: true)"
            )
        if min(height, width) < CNN_MIN_SIZE:
            raise ControlEnvError(
                f"{where}: images {height}x{width} are smaller than the Nature CNN's "
                f"{CNN_MIN_SIZE}x{CNN_MIN_SIZE}"
            )
        if control.normalize_obs:
            raise ControlEnvError(
                f"{where}: control.normalize_obs is for vectors; the CNN scales pixels by 1/255 "
                "(set it false)"
            )
    if not isinstance(action_space, (spaces.Discrete, spaces.Box)):
        raise ControlEnvError(f"{where}: actions {action_space} are not Discrete or Box")


def _image_hint(space: Any) -> str:
    shape = getattr(space, "shape", None)
    if shape is not None and len(shape) == 3:
        return "images must be uint8; channels-last RGB needs control.atari for ALE ids"
    return "dict, tuple and discrete observations are not supported"


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


def close_envs(envs: Any, *, abort: bool = False) -> None:
    """Close a vector env. `abort` (the run ends on an error, Ctrl-C or SIGTERM): an async env's worker
    processes are terminated rather than asked to close: after a signal to the process group they may be
    gone or mid-step, and gymnasium's polite close would wait on their pipes for ever. A polite close that
    takes over `CLOSE_TIMEOUT_S` terminates them too."""
    if type(getattr(envs, "unwrapped", envs)).__name__ == "AsyncVectorEnv":
        with warnings.catch_warnings():
            # A signal can land while a step is pending: gymnasium then warns ("Calling `close` while
            # waiting for a pending call to `step`"), two lines beside the run's one.
            if abort:
                warnings.simplefilter("ignore")
            envs.close(terminate=abort, timeout=CLOSE_TIMEOUT_S)
    else:
        envs.close()


CLOSE_TIMEOUT_S = 10.0


@contextlib.contextmanager
def _workers_leave_signals_to_the_run() -> Iterator[None]:
    """While an async vector env forks its workers: they inherit SIGINT ignored and SIGTERM at its default
    (not the run's handler, which would raise KeyboardInterrupt in each worker and print its traceback when
    Ctrl-C or a scheduler signals the process group). The run itself ends them (`close_envs`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])

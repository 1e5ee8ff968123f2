"""Control algorithms as CleanRL would write them, one module each, registered by name
(`control.algorithm`): PPO's collect and update (`ppo`: also MAPPO/IPPO on a team), SAC and TD3 (`sac_td3`),
the offline learners BC, TD3+BC, IQL, AWR and CQL (`offline`). `registry` says what each declares.

A new algorithm is a module here (or in `run.plugins`) that calls `register_control_algorithm`, plus its
subsection of `control:` in `hone/config/control.py` when it has hyperparameters of its own."""

from hone.control.algos import offline, ppo, sac_td3
from hone.control.algos.registry import (
    CONTROL_ALGORITHMS,
    ControlAlgorithm,
    algorithm_args,
    check_algorithm,
    control_algorithm,
    register_control_algorithm,
)

__all__ = [
    "CONTROL_ALGORITHMS",
    "ControlAlgorithm",
    "algorithm_args",
    "check_algorithm",
    "control_algorithm",
    "offline",
    "ppo",
    "register_control_algorithm",
    "sac_td3",
]

"""Control algorithms as CleanRL would write them, one module each, registered by name
(`control.algorithm`): PPO's collect and update (`ppo`: also MAPPO/IPPO on a team), SAC and TD3 (`sac_td3`),
the offline learners BC, TD3+BC, IQL, AWR and CQL (`offline`). `registry` says what each declares.

A new algorithm is a module here (every module of this package is imported, so it registers itself) or in
`run.plugins` that calls `register_control_algorithm`, plus its subsection of `control:` in
`hone/config/control.py` when it has hyperparameters of its own (a plugin's: `control.args`)."""

import importlib
import pkgutil

from hone.control.algos.registry import (
    CONTROL_ALGORITHMS,
    ControlAlgorithm,
    algorithm_args,
    check_algorithm,
    control_algorithm,
    register_control_algorithm,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "CONTROL_ALGORITHMS",
    "ControlAlgorithm",
    "algorithm_args",
    "check_algorithm",
    "control_algorithm",
    "register_control_algorithm",
]

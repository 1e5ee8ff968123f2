"""The control algorithms a recipe names (`control.algorithm`), each declared once where it is written.

A control algorithm is one module in `hone/control/algos/` that registers a `ControlAlgorithm`: which loop
drives it (`onpolicy`: PPO's collect-then-update; `offpolicy`: SAC/TD3's act-store-update; `offline`: updates
on a dataset, then optionally online), which subsections of `control:` it reads, the network `hone eval`,
`hone collect` and `--ope` rebuild from a saved `model/`, its learner (off-policy and offline algorithms:
networks, optimizers, `update(batch)`, `explore(obs, rng)`), the curves its runs plot and what it can act in.
`check_algorithm` refuses, in one line and before anything starts, every combination the algorithm cannot
run: an unknown name, a multi-agent environment it does not support, a dataset it would not read, keys set in
a subsection it does not read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from torch import nn

from hone.config import ControlConfig, HoneConfig
from hone.control.errors import ControlEnvError
from hone.control.multiagent import is_multi_agent
from hone.registry import Registry

Loop = Literal["onpolicy", "offpolicy", "offline"]
# `control:`'s subsections (`ppo`, `offpolicy`, `offline`, ...): its fields that are sections of their own.
SUBSECTIONS: dict[str, type[BaseModel]] = {
    name: field.annotation
    for name, field in ControlConfig.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
}


@dataclass(frozen=True)
class ControlAlgorithm:
    loop: Loop
    reads: tuple[str, ...]  # the subsections of `control:` it reads (`ppo`, `offpolicy`, `offline`)
    acting_network: Callable[[ControlConfig, Any, Any], nn.Module]  # (control, obs space, action space)
    plot: tuple[str, ...]  # the curves its runs draw unless `logging.plot` names others
    learner: Callable[[ControlConfig, int, Any], Any] | None = None  # (control, obs dim, action space)
    multi_agent: bool = False  # trains on `pettingzoo:` environments too (parameters shared by the agents)
    box_actions: bool = False  # needs a Box action space with finite bounds
    args: type[BaseModel] | None = None  # a plugin's own hyperparameters, given as `control.args`


CONTROL_ALGORITHMS: Registry[ControlAlgorithm] = Registry("control algorithm")


def register_control_algorithm(name: str, algorithm: ControlAlgorithm) -> ControlAlgorithm:
    return CONTROL_ALGORITHMS.register(name)(algorithm)


def control_algorithm(name: str) -> ControlAlgorithm:
    """The algorithm registered as `name`; one line naming the registered ones otherwise."""
    if name not in CONTROL_ALGORITHMS:
        raise ControlEnvError(
            f"control.algorithm {name!r} is not a registered control algorithm; registered: "
            f"{', '.join(sorted(CONTROL_ALGORITHMS))} (a new one: a module in hone/control/algos/, or "
            "run.plugins)"
        )
    return CONTROL_ALGORITHMS[name]


def check_algorithm(cfg: HoneConfig) -> ControlAlgorithm:
    """`control.algorithm` and what the recipe asks of it: one line for what it cannot run."""
    control = cfg.control
    assert control is not None
    name = control.algorithm
    algorithm = control_algorithm(name)
    if is_multi_agent(control.env) and not algorithm.multi_agent:
        multi = sorted(n for n, a in CONTROL_ALGORITHMS.items() if a.multi_agent)
        raise ControlEnvError(
            f"control.algorithm {name} does not train teams: control.env {control.env} is multi-agent; use "
            f"{' or '.join(multi)}"
        )
    if algorithm.loop == "offpolicy" and (control.normalize_obs or control.normalize_reward):
        raise ControlEnvError(
            f"control.normalize_obs / normalize_reward: not with control.algorithm {name} (its replay buffer "
            "would hold observations under changing statistics)"
        )
    if algorithm.loop == "offline" and control.normalize_reward:
        raise ControlEnvError(
            "control.normalize_reward: not with an offline algorithm (rewards are the data's)"
        )
    if cfg.data.source is not None and algorithm.loop != "offline":
        raise ControlEnvError(
            f"data.source: control.algorithm {name} learns from its environment, not a dataset (an offline "
            "algorithm reads data.source)"
        )
    for section, model in SUBSECTIONS.items():
        if section in algorithm.reads:
            continue
        given, default = getattr(control, section).model_dump(), model().model_dump()
        changed = [f"control.{section}.{key}" for key in given if given[key] != default[key]]
        if changed:
            reads = ", ".join(f"control.{s}" for s in algorithm.reads) or "no subsection"
            raise ControlEnvError(
                f"{', '.join(changed)}: not read by control.algorithm {name} (it reads {reads}); remove them"
            )
    algorithm_args(control, algorithm)
    return algorithm


def algorithm_args(control: ControlConfig, algorithm: ControlAlgorithm | None = None) -> BaseModel | None:
    """`control.args` validated against what the algorithm declares (None when it declares none); one
    line naming the key otherwise."""
    algorithm = algorithm or control_algorithm(control.algorithm)
    if algorithm.args is None:
        if control.args:
            raise ControlEnvError(
                f"control.args: control.algorithm {control.algorithm} declares no args (a built-in reads "
                "its subsection of control:)"
            )
        return None
    try:
        return algorithm.args.model_validate(control.args)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise ControlEnvError(
            f"control.args.{key}: {first['msg']} (control.algorithm {control.algorithm})"
        ) from None

"""`GRPOTrainer(environment_factory=...)` as the run's `env` section: a factory (a class, or any callable
returning an instance) named by `pkg.mod:Class` where it can be imported by that name, else registered as
this program's `script:<name>`; a dict of them as `env.name: trl` with `env.args.environments`, each row's
`environment` column choosing one (`hone.envs.trl_env`)."""

from __future__ import annotations

import inspect
from typing import Any

from hone.config import ConfigError
from hone.plugins import spec_for


def environment_section(factory: Any) -> tuple[dict[str, Any], bool]:
    """The `env` keys for `factory`, and whether an environment scores episodes itself (`get_reward`)."""
    factories = factory if isinstance(factory, dict) else {None: factory}
    specs: dict[str, str] = {}
    scores = False
    for name, make in factories.items():
        if not callable(make):
            raise ConfigError(f"environment_factory{'' if name is None else f'[{name!r}]'}: not callable")
        cls = make if inspect.isclass(make) else type(make())  # TRL builds one to read its methods, too
        scores = scores or callable(getattr(cls, "get_reward", None))
        specs[str(name)] = spec_for(make, getattr(make, "__name__", None) or f"env_{name or 'default'}")
    if not isinstance(factory, dict):
        return {"name": specs["None"]}, scores
    return {"name": "trl", "args": {"environments": specs}}, scores

"""TRL code on Hone, unchanged: `from hone.trl import GRPOConfig, GRPOTrainer` in place of `from trl import
...` runs a TRL GRPO script on Hone's loop (`hone.trl.trainer`), and `hone train --trl-config grpo.yaml`
runs a `trl grpo` config file (`hone.cli.trl_config`); both translate TRL's fields by one table
(`hone.config.trl.mapping`). TRL itself is imported only by what needs its classes (the trainer, a
config file's defaults), not by the translation."""

from __future__ import annotations

from typing import Any

__all__ = ["GRPOConfig", "GRPOTrainer"]


def __getattr__(name: str) -> Any:  # importing TRL costs seconds: only when its classes are asked for
    if name in __all__:
        from hone.trl import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'hone.trl' has no attribute {name!r}")

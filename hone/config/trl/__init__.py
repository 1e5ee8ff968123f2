"""TRL's `GRPOConfig` fields as Hone keys: the one translation table (`mapping.translate`) that `hone train
--trl-config` (`hone.cli.trl_config`) and `hone.trl.GRPOTrainer` read TRL's settings with. Pure: no TRL
import (the callers read TRL's classes for its defaults)."""

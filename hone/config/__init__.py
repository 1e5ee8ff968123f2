"""The config: one YAML recipe per run, dotted command-line overrides on top, validated into `HoneConfig`.

Every section forbids unknown keys, so a typo (`algorithm.advantge`) fails before any work starts, with one
line naming the key. Registry names (advantage estimator, policy loss, KL estimator, loss aggregation,
engine, placement) are checked against what is registered by checks the packages above register
(`hone.config.checks`): the config itself imports nothing of Hone's but its leaves, and no torch.
"""

from hone.config.base import ConfigError
from hone.config.control import ControlConfig
from hone.config.load import (
    DEFAULT_RECIPE,
    RECIPES_DIR,
    RUN_CONFIG_HEADER,
    find_recipe,
    list_recipes,
    load_config,
    parse_override,
    validate_recipe,
)
from hone.config.schema import HoneConfig
from hone.config.sections.algorithm import (
    AlgorithmConfig,
    DistillConfig,
    DynamicSamplingConfig,
    EntropyGuardConfig,
    KLConfig,
    OffPolicyConfig,
    ReplayConfig,
)
from hone.config.sections.cluster import ClusterConfig, LearnerRoleConfig
from hone.config.sections.data import DataConfig, DifficultyFilterConfig, EnvConfig
from hone.config.sections.model import CriticConfig, LoraConfig, ModelConfig
from hone.config.sections.preference import DPOConfig, PairsConfig, PreferenceDataConfig, RMConfig
from hone.config.sections.reward import RewardComponentConfig, RewardConfig
from hone.config.sections.rollout import RolloutConfig
from hone.config.sections.run import EvalConfig, LoggingConfig, RunConfig, check_pass_at_ks
from hone.config.sections.trainer import SFTConfig, TrainerConfig

__all__ = [
    "DEFAULT_RECIPE",
    "RECIPES_DIR",
    "RUN_CONFIG_HEADER",
    "AlgorithmConfig",
    "ClusterConfig",
    "ConfigError",
    "ControlConfig",
    "CriticConfig",
    "DPOConfig",
    "DataConfig",
    "DifficultyFilterConfig",
    "DistillConfig",
    "DynamicSamplingConfig",
    "EntropyGuardConfig",
    "EnvConfig",
    "EvalConfig",
    "HoneConfig",
    "KLConfig",
    "LearnerRoleConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OffPolicyConfig",
    "PairsConfig",
    "PreferenceDataConfig",
    "RMConfig",
    "ReplayConfig",
    "RewardComponentConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TrainerConfig",
    "check_pass_at_ks",
    "find_recipe",
    "list_recipes",
    "load_config",
    "parse_override",
    "validate_recipe",
]

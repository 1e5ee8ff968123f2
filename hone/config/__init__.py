"""The config: one YAML recipe per run, dotted command-line overrides on top, validated into `HoneConfig`.

Every section forbids unknown keys, so a typo (`algorithm.advantge`) fails before any work starts, with one
line naming the key. Registry names (advantage estimator, policy loss, KL estimator, loss aggregation, task)
are checked against what is registered.
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
)
from hone.config.schema import (
    AlgorithmConfig,
    ClusterConfig,
    CriticConfig,
    DataConfig,
    DifficultyFilterConfig,
    DPOConfig,
    DynamicSamplingConfig,
    EnvConfig,
    EvalConfig,
    HoneConfig,
    KLConfig,
    LearnerRoleConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OffPolicyConfig,
    PairsConfig,
    PreferenceDataConfig,
    ReplayConfig,
    RewardComponentConfig,
    RewardConfig,
    RMConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    TrainerConfig,
)

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
    "DynamicSamplingConfig",
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
    "find_recipe",
    "list_recipes",
    "load_config",
    "parse_override",
]

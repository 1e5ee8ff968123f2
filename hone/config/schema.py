"""The typed config tree, `HoneConfig`: one pydantic section per recipe section (each in
`hone.config.sections`, by owner), and the rules across sections that need no registry.

Every section forbids unknown keys, so a typo (`algorithm.advantge`) fails before any work starts,
with one line naming the key. Registry names (advantage estimator, policy loss, KL estimator,
loss aggregation, engine, placement) are checked after validation by the checks registered from above
(`hone.config.checks`, `hone.rl.recipe_checks`): the config imports no registry.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import Field, model_validator

from hone.config.base import Section
from hone.config.control import ControlConfig
from hone.config.sections.algorithm import AlgorithmConfig, DistillConfig
from hone.config.sections.cluster import ClusterConfig
from hone.config.sections.data import DataConfig, EnvConfig
from hone.config.sections.model import CriticConfig, ModelConfig
from hone.config.sections.preference import DPOConfig, PairsConfig, RMConfig
from hone.config.sections.reward import RewardConfig
from hone.config.sections.rollout import RolloutConfig
from hone.config.sections.run import EvalConfig, LoggingConfig, RunConfig
from hone.config.sections.trainer import SFTConfig, TrainerConfig


class HoneConfig(Section):
    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
    pairs: PairsConfig = Field(default_factory=PairsConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    rm: RMConfig = Field(default_factory=RMConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    critic: CriticConfig | None = Field(None, description="a value model; set with algorithm.advantage: gae")
    control: ControlConfig | None = Field(
        None, description="a gymnasium environment to train a policy network on, instead of a language model"
    )

    @model_validator(mode="after")
    def _control_reads_its_own_section(self) -> HoneConfig:
        # A control run reads `control:`, `run`, `logging`, `model.path` (what `hone eval` plays) and,
        # offline, `data.source`: a language-model key set on it would be silently ignored, so it is refused.
        if self.control is None:
            return self
        if self.critic is not None:
            raise ValueError("control: needs no critic section (the control policy has its own critics)")
        if self.trainer.world_size > 1 or self.cluster.backend != "local" or self.cluster.mode != "sync":
            raise ValueError(
                "control: runs in one process (trainer.world_size 1, cluster.backend local, cluster.mode "
                "sync); N learner ranks, Ray and asynchronous sampling are for language models"
            )
        ignored = [key for key in _changed_keys(self) if key not in _READ_BY_CONTROL]
        if ignored:
            shown = ", ".join(ignored[:6]) + (f" (+{len(ignored) - 6} more)" if len(ignored) > 6 else "")
            raise ValueError(
                f"control: {shown}: language-model keys a control run does not read; remove them (the "
                "control run's keys are under control:, see `hone config <recipe>`)"
            )
        return self

    @model_validator(mode="after")
    def _what_runs_on_ranks(self) -> HoneConfig:
        if self.trainer.world_size == 1:
            return self
        if self.model.lora is not None and self.sft.enabled and self.algorithm.kl.coef > 0:
            raise ValueError(
                "trainer.world_size > 1 with model.lora, sft.enabled and a KL reference is not supported yet "
                "(the reference swaps the SFT adapter into the sharded model)"
            )
        return self

    @model_validator(mode="after")
    def _system_prompt_where_rendered(self) -> HoneConfig:
        # Plain-text prompts have no system role to put it in; an environment's reset() writes its own chat.
        if self.data.system_prompt is not None and (not self.data.chat_template or self.env.name is not None):
            raise ValueError(
                "data.system_prompt needs data.chat_template: true and single-turn prompts "
                "(an environment's reset() gives its own messages)"
            )
        return self

    @model_validator(mode="after")
    def _distill_alone_trains_every_group(self) -> HoneConfig:
        # Without the reward in the advantage every sampled token carries the teacher's signal: a filter on
        # reward variance would drop groups that teach, and a critic would fit returns nothing reads.
        d = self.distill
        if d.teacher is None or d.reward:
            return self
        if self.algorithm.skip_zero_variance_groups or self.algorithm.dynamic_sampling.enabled:
            raise ValueError(
                "distill.reward: false trains on every group; set algorithm.skip_zero_variance_groups: false "
                "and algorithm.dynamic_sampling.enabled: false"
            )
        if self.critic is not None:
            raise ValueError("distill.reward: false reads no critic: drop the critic section (and gae)")
        if self.algorithm.kl.coef > 0 and self.algorithm.kl.placement == "reward":
            raise ValueError(
                "distill.reward: false has no reward to take the KL from: use algorithm.kl.placement: loss"
            )
        return self

    def to_yaml(self) -> str:
        tree = self.model_dump(mode="json")
        if self.control is not None:  # only what a control run reads: the rest must stay at its defaults
            tree = {
                "run": {k: v for k, v in tree["run"].items() if k not in ("steps", "callbacks")},
                "model": {"path": self.model.path},
                **({"data": {"source": self.data.source}} if self.data.source is not None else {}),
                "logging": tree["logging"],
                "control": tree["control"],
            }
        return yaml.safe_dump(tree, sort_keys=False)


# What a control run reads besides `control:`; every other key must keep its default (`_changed_keys`).
_READ_BY_CONTROL = frozenset(
    {
        *(f"run.{key}" for key in RunConfig.model_fields if key not in ("steps", "callbacks")),
        *(f"logging.{key}" for key in ("tensorboard", "wandb", "wandb_project", "progress", "plot", "video")),
        "logging.video_episodes",
        "model.path",
        "data.source",
    }
)


def _changed_keys(cfg: HoneConfig) -> list[str]:
    """The dotted keys outside `control:` whose values differ from their defaults (a saved config.yaml
    holds every key, so "set" means "not the default")."""
    changed: list[str] = []

    def walk(value: Any, default: Any, prefix: str) -> None:
        if isinstance(value, dict) and isinstance(default, dict):
            for key in value:
                walk(value[key], default.get(key), f"{prefix}.{key}")
        elif value != default:
            changed.append(prefix)

    defaults = {
        name: field.get_default(call_default_factory=True) for name, field in HoneConfig.model_fields.items()
    }
    for name in HoneConfig.model_fields:
        if name in ("control", "critic"):
            continue
        section, default = getattr(cfg, name), defaults[name]
        walk(
            section.model_dump(mode="json") if section is not None else None,
            default.model_dump(mode="json") if default is not None else None,
            name,
        )
    return changed

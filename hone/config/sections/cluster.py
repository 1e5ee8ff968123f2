"""`cluster`: where producers run (`backend`: in the driver's process or Ray actors) and each role's
resources."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from hone.config.base import Section


class SamplerRoleConfig(Section):
    count: int = Field(1, ge=1, description="sampler actors; each produces whole groups of every step")
    num_cpus: float = Field(1, gt=0, description="CPUs reserved for each sampler actor")
    num_gpus: float = Field(0, ge=0, description="GPUs reserved for each sampler actor")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each sampler actor needs (e.g. a node's)"
    )


class RewardWorkersConfig(Section):
    count: int = Field(0, ge=0, description="reward-worker actors; 0 = sampler actors score their own")
    num_cpus: float = Field(1, gt=0, description="CPUs reserved for each reward worker")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources each needs")


class LearnerRoleConfig(Section):
    """Each learner rank's resources beyond the first (`trainer.world_size` N > 1 on Ray: ranks 1..N-1 are
    actors in one placement group). Rank 0 is the driver process, which `ray job submit
    --entrypoint-num-cpus/--entrypoint-num-gpus/--entrypoint-resources` places; with one rank this section
    is ignored (a one-line warning when set)."""

    num_cpus: float = Field(1, gt=0, description="CPUs for each learner rank 1..N-1 (its torch threads)")
    num_gpus: float = Field(0, ge=0, description="GPUs for each learner rank 1..N-1 (1 with NCCL)")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources each needs")


class ClusterConfig(Section):
    backend: str = Field(
        "local",
        description="where producers run, a registered placement (hone.rl.placement.backends.BACKENDS): "
        "local: in the driver's process (inline, or cluster.producers threads); ray: samplers and reward "
        "workers run as Ray actors, the learner in the driver",
    )
    address: str | None = Field(
        None, description="ray: a cluster to attach to (else RAY_ADDRESS; else a local one is started)"
    )
    mode: Literal["sync", "async"] = Field(
        "sync",
        description="async: a producer thread samples and scores the next steps while the learner trains",
    )
    producers: int = Field(
        1,
        ge=1,
        description="async: producer threads, each with its own sampler (one more copy of the weights "
        "each), so more than one step is in flight",
    )
    producer_split: Literal["shares", "steps"] = Field(
        "shares",
        description="several producers: shares = every step split over them (speeds up on-policy training); "
        "steps = each step to one producer in turn (k steps sampled at once; needs max_staleness >= k - 1)",
    )
    producer_retries: int = Field(
        2,
        ge=0,
        description="times a step whose producing raised (sampler, reward, environment) is produced again "
        "before the run stops",
    )
    max_staleness: int | Literal["auto"] = Field(
        1,
        description="async: η, the most weight versions a trained rollout may lag the learner (0 = sync); "
        "auto: adjusted every step from the learner's wait, the importance weights' ESS and the reward trend "
        "(hone.rl.placement.staleness), within [0, max_staleness_cap]",
    )
    max_staleness_cap: int = Field(
        8, ge=0, description="async, max_staleness auto: the largest η it may admit"
    )
    publish_timeout_s: float = Field(
        600.0,
        gt=0,
        description="the most a published version may wait for the sampler to finish the step it is sampling",
    )
    samplers: SamplerRoleConfig = Field(default_factory=SamplerRoleConfig)
    reward_workers: RewardWorkersConfig = Field(default_factory=RewardWorkersConfig)
    learner: LearnerRoleConfig = Field(default_factory=LearnerRoleConfig)
    start_timeout_s: float = Field(120.0, gt=0, description="ray: the most the actors may take to start")

    @field_validator("max_staleness")
    @classmethod
    def _staleness(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError(f"max_staleness must be >= 0 or auto, got {v}")
        return v

    @model_validator(mode="after")
    def _producers_need_async(self) -> ClusterConfig:
        if self.producers > 1 and self.mode != "async":
            raise ValueError(
                f"producers={self.producers} needs mode: async (a synchronous run has one step in flight)"
            )
        return self

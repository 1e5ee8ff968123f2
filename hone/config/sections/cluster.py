"""`cluster`: where producers run (`backend`: in the driver's process or Ray actors) and each role's
resources."""

from __future__ import annotations

from pydantic import Field

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
        "local: in the driver's process (inline, or trainer.producers threads); ray: samplers and reward "
        "workers run as Ray actors, the learner in the driver",
    )
    address: str | None = Field(
        None, description="ray: a cluster to attach to (else RAY_ADDRESS; else a local one is started)"
    )
    samplers: SamplerRoleConfig = Field(default_factory=SamplerRoleConfig)
    reward_workers: RewardWorkersConfig = Field(default_factory=RewardWorkersConfig)
    learner: LearnerRoleConfig = Field(default_factory=LearnerRoleConfig)
    start_timeout_s: float = Field(120.0, gt=0, description="ray: the most the actors may take to start")

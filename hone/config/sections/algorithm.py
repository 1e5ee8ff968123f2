"""`algorithm` (the advantage estimator, the policy loss, KL, off-policy correction, filters, replay) and
`distill` (a teacher's per-token signal in the advantage). Registry names are checked after validation
(`hone.rl.recipe_checks`); a preset's name is the config's own (`hone.config.presets`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hone.config.base import Section
from hone.config.presets import PRESETS


def _check_registered(value: str, registry: dict[str, Any], kind: str) -> str:
    if value not in registry:
        raise ValueError(f"unknown {kind} {value!r}; registered: {', '.join(sorted(registry))}")
    return value


class KLConfig(Section):
    coef: float = Field(
        0.0,
        ge=0,
        description="weight of the KL penalty to the reference (the starting) model; 0 = no reference model "
        "(TRL: beta)",
    )
    estimator: str = Field("k3", description="KL estimator (Schulman's k1, k2, k3 = verl's low_var_kl...)")
    placement: Literal["loss", "reward"] = Field(
        "loss",
        description="loss: a KL term in the loss (GRPO); reward: subtracted from the reward per token "
        "(PPO/RLHF)",
    )

    @model_validator(mode="after")
    def _k1_not_in_loss(self) -> KLConfig:
        # d/dθ k1 = ∇log π, whose expectation under π is 0: as a loss term k1 regularises nothing.
        if self.coef > 0 and self.placement == "loss" and self.estimator == "k1":
            raise ValueError(
                "estimator 'k1' in the loss has zero expected gradient (a no-op); "
                "use estimator k3 (or k2) in the loss, or k1 with placement reward"
            )
        return self


# The keys each built-in correction reads (hone/algorithms/offpolicy.py), and the bounds it takes when
# lo / hi are null: verl's rejection defaults (lower = 1 / upper).
DEFAULT_LO = 0.5
DEFAULT_HI = 2.0
_OFF_POLICY_KEYS = {"none": set(), "tis": {"cap"}, "mis": {"lo", "hi"}, "decoupled": {"bound", "lo", "hi"}}


class OffPolicyConfig(Section):
    name: str = Field("none", description="none | tis | mis | decoupled; see README 'Off-policy correction'")
    level: Literal["token", "sequence", "geometric"] = Field(
        "token", description="ratio per token, per sequence (product), or geometric (per-token mean)"
    )
    cap: float | None = Field(None, gt=0, description="tis: weight = min(ratio, cap); null = 2.0")
    lo: float | None = Field(None, ge=0, description="mis / decoupled bound: lower ratio bound; null = 0.5")
    hi: float | None = Field(None, gt=0, description="mis / decoupled bound: upper ratio bound; null = 2.0")
    bound: Literal["mask", "clamp"] | None = Field(
        None, description="decoupled: drop (mask) or clamp weights outside [lo, hi]; null = unbounded"
    )

    @model_validator(mode="after")
    def _keys_that_apply(self) -> OffPolicyConfig:
        # A key the chosen correction ignores is refused: a bound silently not applied is AReaL's trap.
        given = {key for key in ("cap", "lo", "hi", "bound") if getattr(self, key) is not None}
        unused = sorted(given - _OFF_POLICY_KEYS.get(self.name, given))  # plugins' names: not checked
        if unused:
            raise ValueError(f"{', '.join(unused)} not used by off-policy correction {self.name!r}")
        if self.name == "decoupled" and self.bound is None and given & {"lo", "hi"}:
            raise ValueError("lo/hi bound decoupled's weight only with bound: mask or clamp")
        lo = DEFAULT_LO if self.lo is None else self.lo
        hi = DEFAULT_HI if self.hi is None else self.hi
        if lo >= hi:
            raise ValueError(f"lo ({lo}) must be below hi ({hi})")
        return self


class DynamicSamplingConfig(Section):
    """DAPO's dynamic sampling (Yu et al. 2025, §3.2): sample further prompts until the step has
    `data.prompts_per_step` groups whose rewards differ; see README "Dynamic sampling"."""

    enabled: bool = Field(
        False,
        description="sample further prompts until the step has prompts_per_step groups with differing "
        "rewards (DAPO)",
    )
    max_rounds: int = Field(
        4, ge=0, description="extra sampling rounds a step may take; past them it trains on what it has"
    )


class ReplayConfig(Section):
    """RLEP's experience replay (Zhang et al. 2025): past successes of prompts not yet solved are mixed
    into their later groups; see README "Experience replay"."""

    enabled: bool = Field(
        False, description="mix stored successes into later groups of prompts not yet solved (RLEP)"
    )
    min_reward: float = Field(1.0, description="a rollout whose reward reaches this is a success to keep")
    max_pass_rate: float = Field(
        0.5,
        gt=0,
        le=1,
        description="a prompt whose group's share of successes is below this gets (and stores) replays",
    )


class EntropyGuardConfig(Section):
    """An opt-in response to entropy collapse (README "Agents" → collapse guards): while the sampled
    tokens' entropy falls below `floor`, the update adds an entropy bonus of weight `coef`."""

    floor: float | None = Field(
        None,
        ge=0,
        description="nats a token: when the step's sampled entropy (the mean -log p of its sampled response "
        "tokens) is below it, the entropy bonus `coef` is on for that update; null = off",
    )
    coef: float = Field(0.01, gt=0, description="the entropy bonus's weight while the guard is on")


class AlgorithmConfig(Section):
    preset: str | None = Field(
        None,
        description="a paper's settings (hone.config.presets: grpo, dr_grpo, dapo, gspo...): sets every "
        "algorithm key the paper changes that the recipe leaves unset; `hone config` shows the result",
    )
    advantage: str = Field(
        "grpo",
        description="advantage estimator (hone.algorithms.ADVANTAGE_ESTIMATORS): grpo, dr_grpo, rloo, "
        "reinforce_pp, gae (with a critic section)... (verl: adv_estimator)",
    )
    advantage_args: dict[str, Any] = Field(
        default_factory=dict,
        description="the estimator's own keyword hyperparameters that no key of this section sets, e.g. "
        "{whiten: true} for gae or a plugin estimator's; checked against its signature",
    )
    policy_loss: str = Field(
        "ppo",
        description="policy loss (hone.algorithms.POLICY_LOSSES): ppo (clipped ratio), gspo (sequence "
        "ratio)...",
    )
    loss_agg: str | None = Field(None, description="null = the loss's own (token-mean; GSPO: seq-mean)")
    clip_low: float | None = Field(None, ge=0, description="null = the loss's own default")
    clip_high: float | None = Field(
        None,
        ge=0,
        description="upper clip of the ratio (DAPO's clip-higher, e.g. 0.28); null = clip_low (TRL: "
        "epsilon_high)",
    )
    dual_clip: float | None = Field(
        None,
        gt=1,
        description="ppo: dual-clip bound c > 1 on negative-advantage ratios (Ye et al. 2020); null = off",
    )
    norm_by_std: bool = Field(
        True,
        description="divide group advantages by the group's reward std (GRPO; advantage_args "
        "{std_over: batch}: the batch's std); false = Dr. GRPO's mean-only (TRL: scale_rewards)",
    )
    eps: float = Field(
        1e-6, description="added to the std before dividing, so an all-equal group does not divide by zero"
    )
    gamma: float = Field(
        1.0, description="discount per token (gae, reinforce_pp), per turn (turn_grpo, gigpo, turn_reinforce)"
    )
    lam: float = Field(1.0, description="GAE's lambda: 1.0 = Monte-Carlo returns, 0 = one-step TD")
    entropy_coef: float = Field(0.0, description="weight of an entropy bonus in the loss; 0 = none")
    turn_baseline: Literal["trajectory", "turn_index"] = Field(
        "trajectory",
        description="turn_grpo: baseline each turn with the group's trajectory returns (GRPO's) or with the "
        "returns-to-go of the group's turns of the same index",
    )
    step_advantage_weight: float = Field(
        1.0,
        ge=0,
        description="gigpo: ω, the weight of the step (anchor-state) advantage beside the episode's",
    )
    entropy_guard: EntropyGuardConfig = Field(default_factory=EntropyGuardConfig)
    kl: KLConfig = Field(default_factory=KLConfig)
    old_log_probs: Literal["recompute", "sampler"] = Field(
        "sampler",
        description="behaviour log-probs: the sampler's own (free; exact while the sampler shares the "
        "trainer's weights and numerics) or a trainer recomputation (one more forward pass; for an "
        "engine whose numerics differ)",
    )
    skip_zero_variance_groups: bool = Field(
        False,
        description="drop groups whose rewards are all equal (no learning signal; DAPO) without refilling "
        "the step; dynamic_sampling.enabled drops them and refills",
    )
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    mask_truncated: bool = Field(
        False,
        description="leave responses cut at max_new_tokens (finish_reason length) out of the loss (DAPO's "
        "overlong filtering); they still count in the group baseline and the metrics",
    )
    off_policy: OffPolicyConfig = Field(default_factory=OffPolicyConfig)

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str | None) -> str | None:
        return v if v is None else _check_registered(v, PRESETS, "algorithm.preset")

    @model_validator(mode="after")
    def _usable(self) -> AlgorithmConfig:
        if self.dual_clip is not None and self.policy_loss != "ppo":
            raise ValueError(f"dual_clip applies to the 'ppo' loss only, not {self.policy_loss!r}")
        if self.off_policy.name != "none" and self.old_log_probs != "recompute":
            raise ValueError(
                f"off_policy.name {self.off_policy.name!r} needs old_log_probs: recompute "
                "(the anchor π_old is the trainer's recomputation; the sampler's log-probs are π_behav)"
            )
        return self


class DistillConfig(Section):
    """On-policy distillation (hone.algorithms.distill): a teacher scores the student's own samples."""

    teacher: str | None = Field(
        None,
        description="the teacher: what model.path accepts (local dir, hub name, alias); its tokenizer must "
        "be the student's; null = no distillation",
    )
    coef: float = Field(1.0, gt=0, description="weight of the per-token reverse KL in the advantage")
    mode: Literal["reverse_kl"] = Field(
        "reverse_kl",
        description="reverse_kl: advantage -coef * (log p_student - log p_teacher) per sampled token",
    )
    reward: bool = Field(
        True,
        description="add the reward's advantage (algorithm.advantage) to the distillation term; false = "
        "distillation alone (rewards are still scored, logged and evaluated)",
    )

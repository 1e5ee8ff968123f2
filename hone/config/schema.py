"""The typed config tree: one pydantic section per recipe section.

Every section forbids unknown keys, so a typo (`algorithm.advantge`) fails before any work starts,
with one line naming the key. Registry names (advantage estimator, policy loss, KL estimator,
loss aggregation, engine, placement) are checked after validation by the checks registered from above
(`hone.config.checks`, `hone.rl.recipe_checks`): this module imports no registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from hone.config.base import Section
from hone.config.control import ControlConfig
from hone.config.presets import PRESETS


def _check_registered(value: str, registry: dict[str, Any], kind: str) -> str:
    if value not in registry:
        raise ValueError(f"unknown {kind} {value!r}; registered: {', '.join(sorted(registry))}")
    return value


class RunConfig(Section):
    name: str = Field(
        "demo",
        description="the run's name: its directory is run.dir/run.name (an existing one is refused unless "
        "--resume)",
    )
    plugins: list[str] = Field(
        default_factory=list, description="modules imported first, e.g. ones that register new algorithms"
    )
    dir: str = Field("runs", description="where run directories go (relative to the current directory)")
    seed: int = Field(
        0,
        description="seeds sampling, data order and initialisation; the same seed and config give the same "
        "run",
    )
    steps: int = Field(200, ge=0, description="RL steps (optimizer rounds of sample → score → update)")
    time_limit_s: float | None = Field(
        None, gt=0, description="wall-time budget of this session (SFT included); RL stops when it is spent"
    )
    save_every: int = Field(
        50,
        ge=0,
        description="checkpoint cadence in steps (RL steps; SFT/DPO/RM optimizer steps); 0 = only at the end",
    )
    keep_last: int | None = Field(
        2, ge=1, description="checkpoints kept on disk (older ones are deleted); null = all"
    )
    eval_every: int = Field(50, ge=0, description="held-out eval cadence in steps; 0 = start and end only")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: all cores)")
    callbacks: list[str] = Field(
        [],
        description="'pkg.module:fn' functions called as fn(step, metrics) after every RL step (and every "
        "SFT/DPO/RM optimizer step), once it is logged and checkpointed (alerts, custom stopping rules): one "
        "that raises ends the run, KeyboardInterrupt as Ctrl-C does",
    )


class LoraConfig(Section):
    r: int = Field(16, ge=1, description="LoRA rank (peft)")
    alpha: int = Field(32, description="LoRA scaling numerator: updates are scaled by alpha / r")
    dropout: float = Field(0.0, description="dropout on the LoRA branch")
    target_modules: list[str] | str = Field(
        "all-linear", description="modules that get adapters: 'all-linear' or a list of module names"
    )


class ModelConfig(Section):
    path: str = Field(
        "tiny",
        description="local dir, hub name, or alias (tiny, tiny:<name>, tiny-vl, smollm2-135m-instruct)",
    )
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32",
        description="weights' dtype for training: float32, bfloat16, or auto (the checkpoint's own)",
    )
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto | cpu | cuda[:N]")
    lora: LoraConfig | None = None
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass: less memory, ~30% more time"
    )
    freeze_vision: bool = Field(
        False,
        description="a vision-language model: train the language model only, the vision tower frozen "
        "(LoRA always adapts the language model only)",
    )


class DifficultyFilterConfig(Section):
    """ROLL's difficulty mask (0.1-0.95) as a cool-down: see `hone.data.passrates.CoolDown`."""

    lo: float = Field(0.1, ge=0, le=1, description="prompts tracked below this pass rate are skipped")
    hi: float = Field(0.95, ge=0, le=1, description="prompts tracked above this pass rate are skipped")
    cooldown_steps: int = Field(10, ge=1, description="steps a prompt out of [lo, hi] is skipped for")

    @model_validator(mode="after")
    def _ordered(self) -> DifficultyFilterConfig:
        if self.lo > self.hi:
            raise ValueError(f"data.difficulty_filter: lo ({self.lo}) must be <= hi ({self.hi})")
        return self


class DataConfig(Section):
    task: str | None = Field(
        None,
        description="a built-in generated task (hone.data.tasks: arithmetic, word_problems...) instead of a "
        "data.source; null = none (the default recipe names arithmetic)",
    )
    task_args: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the built-in task (e.g. arithmetic's min_digits, ops)",
    )
    source: str | None = Field(
        None,
        description="jsonl/parquet file, HF dataset name, or reasoning_gym:<name> (instead of task)",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="with source reasoning_gym:<name>: that dataset's config (its difficulty settings)",
    )
    eval_source: str | None = Field(
        None,
        description="held-out file/dataset for eval/accuracy; null = hold out data.eval_size rows of "
        "data.source (at most 10%, chosen by a hash of each row)",
    )
    subset: str | None = Field(None, description="HF dataset configuration name (e.g. gsm8k's 'main')")
    prompt_field: str = Field(
        "prompt", description="the column holding the prompt (text, or a list of chat messages)"
    )
    answer_field: str = Field(
        "answer", description="the column holding the reference answer the reward compares against"
    )
    messages_field: str | None = Field(
        None, description="a column of chat messages to use as the prompt instead of prompt_field"
    )
    image_field: str | None = Field(
        None,
        description="a column of the prompt's images for a vision-language model: a path (relative to the "
        "data file) or a list of paths, or an HF datasets Image column; in order, one per {type: image} "
        "part of the chat messages (a plain-text prompt's go before its text); null = none, or only images "
        "that message parts carry themselves",
    )
    chat_template: bool = Field(False, description="render prompts through the tokenizer's chat template")
    system_prompt: str | None = Field(
        None,
        description="with chat_template: a system message opening every single-turn prompt (e.g. the "
        "answer format a verifier expects) unless the sample's own messages start with one",
    )
    train_size: int = Field(100_000, ge=1, description="generated training problems (task, reasoning_gym)")
    eval_size: int = Field(1000, ge=1, description="held-out problems for eval/accuracy")
    prompts_per_step: int = Field(
        32,
        ge=1,
        description="prompts (groups) sampled per RL step; each is answered rollout.n times (TRL/verl: the "
        "batch of prompts)",
    )
    scheduler: str = Field(
        "uniform",
        description="which prompts each step draws: uniform (seeded epoch shuffle), difficulty (pass rate "
        "near a target), or a dotted path 'pkg.mod:Class' (hone.data.schedulers.PromptScheduler)",
    )
    scheduler_args: dict[str, Any] = Field(default_factory=dict, description="the scheduler's keyword args")
    pass_rate_ema: float = Field(
        0.5, gt=0, le=1, description="weight of a new group in a prompt's tracked pass rate (an EMA)"
    )
    difficulty_filter: DifficultyFilterConfig | None = Field(
        None, description="skip prompts whose tracked pass rate is outside [lo, hi] for cooldown_steps"
    )

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if self.task is not None and self.source is not None:
            raise ValueError("set only one of data.task (built-in) or data.source (dataset)")
        # A separate key from task_args, so a built-in task's options left over from a base recipe
        # never reach a reasoning-gym config (and args never silently miss a file source).
        if self.args and not (self.source or "").startswith("reasoning_gym:"):
            raise ValueError(
                "data.args is the config of data.source reasoning_gym:<name>; use data.task_args"
            )
        return self


class RolloutConfig(Section):
    engine: str = Field(
        "hf",
        description="a registered engine (hone.rollout.engines.ENGINES): hf: transformers in this process; "
        "vllm: a vLLM engine in its own environment",
    )
    n: int = Field(8, ge=1, description="samples per prompt (the group size)")
    temperature: float = Field(1.0, gt=0, description="> 0: the trainer scores logits / temperature")
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="nucleus sampling: keep the smallest token set with this much probability",
    )
    top_k: int = Field(0, ge=0, description="sample among the k most likely tokens; 0 = all")
    max_new_tokens: int = Field(
        16,
        ge=1,
        description="longest response in tokens; a longer one is cut (finish_reason length) (TRL: "
        "max_completion_length)",
    )
    stop: list[str] = Field(default_factory=list, description="strings that end a response (kept in it)")
    max_batch_size: int = Field(512, ge=1, description="most sequences the engine generates at once")
    dtype: Literal["model", "bfloat16"] = Field(
        "model",
        description="an engine that casts its weights (hf): the sampler's copy of the weights in the "
        "policy's dtype, or in bfloat16 (decodes faster on CPUs with AMX and on GPUs; its log-probs then "
        "differ from an fp32 trainer's); other engines sample in model.dtype",
    )
    interruptible: bool = Field(
        False,
        description="async, on an engine and a cluster.backend that declare it (hf, local): a publish "
        "lands mid-generation (between two tokens; the live rows are re-prefilled with the new weights) "
        "instead of at the producer's next share; each token records its version (Rollout.token_versions)",
    )
    prefix_cache: bool = Field(
        True,
        description="keep the KV cache of the last generate call's sequences and prefill only what a new "
        "prompt adds to one (each turn of a multi-turn episode); dropped whenever a weight changes",
    )
    vllm_python: str = Field(
        ".venv-vllm/bin/python", description="vllm: the Python of the vLLM environment (make setup-vllm)"
    )
    vllm_kv_cache_gib: int = Field(
        2, ge=1, description="vllm on CPU: KV cache memory (VLLM_CPU_KVCACHE_SPACE)"
    )
    vllm_timeout_s: float = Field(600.0, gt=0, description="vllm: the most one engine request may take")
    # Agent programs via an OpenAI-compatible endpoint (hone/rollout/agent.py, README).
    agent: str | None = Field(
        None,
        description="'pkg.mod:fn': an async agent run(client | base_url, sample) -> reward that talks to the "
        "policy at a local OpenAI-compatible endpoint; it plays the episodes (an env then only supplies "
        "samples and SFT demonstrations)",
    )
    agent_concurrency: int = Field(32, ge=1, description="agent episodes running at once")
    agent_timeout_s: float = Field(120.0, gt=0, description="the most one agent episode may take")
    agent_max_completions: int = Field(
        8, ge=1, description="chat completions one agent episode may request (its turns)"
    )
    agent_tool_parser: str = Field(
        "hermes", description="how the endpoint reads tool calls in the model's output (hone.envs.parsers)"
    )
    agent_port: int = Field(
        0, ge=0, le=65535, description="the endpoint's port on 127.0.0.1; 0 = any free one"
    )


class RewardComponentConfig(Section):
    fn: str = Field(description="a built-in reward name, 'task', or a dotted path 'pkg.mod:fn'")
    weight: float = Field(1.0, description="this component's weight in the total reward")
    args: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the reward's factory"
    )
    timeout_s: float | None = Field(None, gt=0, description="per-call timeout; default reward.timeout_s")
    correctness: bool = Field(
        False, description="this component grades correctness: eval/accuracy counts it, not the total"
    )


class RewardConfig(Section):
    fn: str | None = Field(
        None, description="one reward: a built-in name (math, code, format, ...), 'task', or 'pkg.mod:fn'"
    )
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for reward.fn")
    components: dict[str, RewardComponentConfig] = Field(
        default_factory=dict, description="several rewards, summed with weights, each logged by name"
    )
    timeout_s: float = Field(
        30.0, gt=0, description="per-call timeout; a timed-out call is left out of training (reward/timeouts)"
    )
    max_concurrency: int = Field(16, ge=1, description="reward calls running at once")
    max_failed_steps: int = Field(
        5, ge=1, description="stop the run after this many RL steps in a row on which every reward failed"
    )
    sandbox_concurrency: int | None = Field(
        None,
        ge=1,
        description="sandboxed programs running at once (code reward); default: reward.max_concurrency",
    )

    @model_validator(mode="after")
    def _one_form(self) -> RewardConfig:
        if self.fn is not None and self.components:
            raise ValueError("set either reward.fn or reward.components, not both")
        if self.args and self.fn is None:
            raise ValueError("reward.args needs reward.fn (components take their own args)")
        marked = [name for name, c in self.components.items() if c.correctness]
        if len(marked) > 1:
            raise ValueError(f"only one reward component can set correctness: true, got {marked}")
        return self

    def resolved(self) -> dict[str, RewardComponentConfig]:
        """The components to build: `components`, or the single `fn` (default 'task') named after it."""
        if self.components:
            return dict(self.components)
        fn = self.fn or "task"
        return {fn.rpartition(":")[2]: RewardComponentConfig(fn=fn, args=self.args)}


class EnvConfig(Section):
    name: str | None = Field(
        None, description="multi-turn environment: a registered name or 'pkg.mod:Class'; null = single-turn"
    )
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the environment")
    max_turns: int | None = Field(None, ge=1, description="assistant turns per episode; null = the env's own")
    max_tokens_per_turn: int = Field(32, ge=1, description="longest assistant turn in tokens")
    max_total_tokens: int = Field(1024, ge=2, description="prompt + every turn + observations")
    drop_void_turns: bool = Field(
        False, description="drop trajectories with an empty or cut-off turn from training (SimpleTIR)"
    )


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
        description="divide group advantages by the group's reward std (GRPO); false = Dr. GRPO's mean-only "
        "(TRL: scale_rewards)",
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


class CriticConfig(Section):
    """PPO's value model (`algorithm.advantage: gae`); see README "PPO with a critic"."""

    path: str | None = Field(
        None,
        description="a model dir or hub name for the critic's trunk (a saved critic keeps its value head); "
        "null = the policy's start (the SFT result after a warm start), with a new value head",
    )
    lr: float = Field(1e-4, gt=0, description="critic learning rate (AdamW)")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="critic learning-rate schedule"
    )
    weight_decay: float = Field(0.0, description="critic AdamW weight decay")
    warmup_steps: int = Field(
        0,
        ge=0,
        description="first RL steps that train only the critic: the policy neither moves nor publishes",
    )
    value_clip: float | None = Field(
        None, gt=0, description="ε_v: PPO2's value clipping around the values the batch was sampled with"
    )
    value_coef: float = Field(
        1.0,
        gt=0,
        description="scales the value loss; the critic is its own model, so it acts as an LR factor",
    )
    micro_batch_size: int | None = Field(
        None, ge=1, description="sequences per critic forward/backward; null = trainer.micro_batch_size"
    )
    grad_clip: float | None = Field(
        1.0, gt=0, description="clip the critic gradient's global norm; null = no clipping"
    )


class TrainerConfig(Section):
    lr: float = Field(1e-4, gt=0, description="policy learning rate (AdamW) (TRL: learning_rate)")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="learning-rate schedule over run.steps after the warm-up"
    )
    warmup_steps: int = Field(0, ge=0, description="RL steps of linear warm-up")
    weight_decay: float = Field(0.0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    fused_adamw: bool = Field(
        True,
        description="torch's fused AdamW kernel (one pass per parameter; N sharded ranks use the "
        "multi-tensor one); the same update up to float rounding",
    )
    ppo_epochs: int = Field(
        1, ge=1, description="passes over each RL batch (TRL: num_iterations; verl: ppo_epochs)"
    )
    mini_batches: int = Field(1, ge=1, description="optimizer steps per epoch over one RL batch")
    micro_batch_size: int = Field(256, ge=1, description="sequences per forward/backward, at most")
    micro_batch_tokens: int = Field(
        8192, ge=1, description="padded tokens per forward/backward, at most (logits are tokens x vocab)"
    )
    grad_clip: float | None = Field(
        1.0,
        gt=0,
        description="clip the gradient's global norm to this; null = no clipping (TRL: max_grad_norm)",
    )
    disable_dropout: bool = Field(
        True, description="zero every dropout for RL, so the on-policy ratio is exactly 1 (as TRL)"
    )
    max_nonfinite_steps: int = Field(
        3, ge=1, description="optimizer steps in a row with a NaN/inf gradient norm (each skipped) to stop"
    )
    log_entropy: bool = Field(True, description="log the policy's entropy (computed in chunks, no graph)")
    shared_prompts: bool = Field(
        True,
        description="rows with the same prompt (a group) forward it once in training and log-prob passes; "
        "exact up to float rounding",
    )
    autocast: Literal["none", "bfloat16"] = Field(
        "none",
        description="bfloat16: the training forward/backward's matmuls in bf16 (torch.autocast), weights, "
        "gradients, optimizer and log-softmax in fp32 (model.dtype float32)",
    )
    mode: Literal["sync", "async"] = Field(
        "sync",
        description="async: a producer thread samples and scores the next steps while the learner trains",
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
    verify_weights: bool = Field(
        True,
        description="after every weight load the engine reports an exact fingerprint of the weights it holds "
        "and the version; a difference from what the learner published stops the run (rollout.fingerprint)",
    )
    verify_every: int = Field(
        1,
        ge=0,
        description="the log-prob canary's cadence in steps: the sampler's log-probs of the step's rollouts "
        "sampled at the learner's version against the learner's (free: a pass the update makes); 0 = off",
    )
    max_logprob_mismatch: float | None = Field(
        None,
        gt=0,
        description="the canary's budget, mean |log π_sampler - log π_learner| per token; null = by dtype: "
        "1e-3 when sampler and update both run fp32, 5e-2 when either is bf16",
    )
    mismatch_patience: int = Field(
        3, ge=1, description="canary checks in a row over max_logprob_mismatch that stop the run"
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

    world_size: int = Field(
        1,
        ge=1,
        description="learner ranks, one process each (gloo on CPU, NCCL with one GPU each); under torchrun "
        "its WORLD_SIZE",
    )
    strategy: Literal["fsdp2", "ddp"] = Field(
        "fsdp2",
        description="N ranks: fsdp2 shards parameters, gradients and optimizer state; ddp replicates them",
    )
    collective_timeout_s: float = Field(
        600.0, gt=0, description="N ranks: the most one collective (all-gather, reduce, barrier) may wait"
    )

    @field_validator("max_staleness")
    @classmethod
    def _staleness(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError(f"max_staleness must be >= 0 or auto, got {v}")
        return v

    @model_validator(mode="after")
    def _producers_need_async(self) -> TrainerConfig:
        if self.producers > 1 and self.mode != "async":
            raise ValueError(
                f"producers={self.producers} needs mode: async (a synchronous run has one step in flight)"
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


class SFTConfig(Section):
    enabled: bool = Field(False, description="supervised warm-start before RL (teaches the answer format)")
    data: str | None = Field(None, description="jsonl of prompt/response pairs; null = task demonstrations")
    examples: int = Field(
        20_000, ge=1, description="demonstrations generated from the task when sft.data is null"
    )
    lr: float = Field(1e-3, gt=0, description="SFT learning rate")
    batch_size: int = Field(128, ge=1, description="demonstrations per SFT optimizer step")
    micro_batch_size: int | None = Field(
        None, ge=1, description="sequences per forward/backward; null = trainer.micro_batch_size"
    )
    max_steps: int = Field(1000, ge=1, description="most SFT optimizer steps")
    stop_at_accuracy: float | None = Field(None, ge=0, le=1, description="stop when val accuracy ≥ this")
    eval_every: int = Field(25, ge=1, description="SFT validation cadence in steps (for stop_at_accuracy)")
    val_size: int = Field(
        500, ge=1, description="held-out problems SFT validates on (disjoint from the eval set)"
    )


class PairsConfig(Section):
    """`hone pairs`: preference pairs sampled from the recipe's model and labelled by its reward."""

    prompts: int = Field(1000, ge=1, description="training prompts to sample (rollout.n responses each)")
    per_prompt: int = Field(1, ge=1, description="pairs per prompt, at most (best with worst, then next)")
    min_margin: float = Field(0.0, ge=0, description="a pair's rewards must differ by more than this")
    out: str | None = Field(None, description="jsonl to write; null = runs/<run.name>/pairs.jsonl")


class PreferenceDataConfig(Section):
    """What `hone dpo` and `hone rm` share: the preference file (TRL's formats) and the optimisation."""

    data: str | None = Field(
        None, description="preference pairs: jsonl/parquet file, save_to_disk dir or HF dataset name"
    )
    split: str = Field("train", description="the split of a hub dataset or a saved DatasetDict")
    subset: str | None = Field(None, description="HF dataset configuration name")
    prompt_field: str = Field("prompt", description="the column holding the prompt")
    chosen_field: str = Field("chosen", description="the column holding the preferred response")
    rejected_field: str = Field("rejected", description="the column holding the dispreferred response")
    lr: float = Field(1e-6, gt=0, description="learning rate (AdamW)")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "linear", description="learning-rate schedule over the steps after the warm-up"
    )
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up")
    weight_decay: float = Field(0.0, description="AdamW weight decay")
    batch_size: int = Field(8, ge=1, description="pairs per optimizer step")
    micro_batch_size: int | None = Field(None, ge=1, description="pairs per forward/backward; null = all")
    steps: int = Field(100, ge=1, description="optimizer steps")


class DPOConfig(PreferenceDataConfig):
    loss: str = Field("sigmoid", description="sigmoid (DPO) | cdpo | ipo | simpo")
    beta: float | None = Field(None, gt=0, description="null = the loss's own (0.1; simpo 2.0)")
    label_smoothing: float | None = Field(
        None, gt=0, lt=0.5, description="cdpo: ε, the assumed share of flipped labels; null = 0.1"
    )
    simpo_gamma: float | None = Field(None, ge=0, description="simpo: target margin γ; null = 0.5")
    cache_reference: bool = Field(
        True, description="score each pair under the reference once, before training, and keep the numbers"
    )
    eval: bool = Field(
        False, description="held-out task accuracy (data.task / data.eval_source) before and after DPO"
    )

    @model_validator(mode="after")
    def _keys_that_apply(self) -> DPOConfig:
        # A hyper-parameter the chosen loss ignores is refused rather than silently not applied.
        if self.label_smoothing is not None and self.loss != "cdpo":
            raise ValueError(f"label_smoothing applies to loss cdpo only, not {self.loss!r}")
        if self.simpo_gamma is not None and self.loss != "simpo":
            raise ValueError(f"simpo_gamma applies to loss simpo only, not {self.loss!r}")
        return self


class RMConfig(PreferenceDataConfig):
    lr: float = Field(1e-5, gt=0, description="learning rate (AdamW)")
    eval_data: str | None = Field(None, description="held-out pairs; null = hold out val_fraction of rm.data")
    val_fraction: float = Field(0.1, gt=0, lt=1, description="share of rm.data held out when no eval_data")
    eval_every: int = Field(
        25, ge=1, description="held-out pair accuracy every this many steps, and at the end"
    )
    center_rewards_coef: float = Field(
        0.0, ge=0, description="coef of the (r_chosen + r_rejected)² penalty (TRL center_rewards_coefficient)"
    )
    max_length: int | None = Field(
        None, ge=1, description="keep the last this many tokens of each text (as the reward_model reward)"
    )


def check_pass_at_ks(ks: Sequence[int], n: int) -> None:
    """Refuse a pass@k that `n` samples per problem cannot estimate (k outside 1..n): checked before
    anything is sampled, so no pass@k is ever dropped silently. One check for the config (`eval.k`,
    `eval.n`, before any model loads) and for `evaluate` (the library guard)."""
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(
            f"k={bad}: pass@k needs 1 <= k <= eval.n (samples per problem); got k={list(ks)}, n={n}"
        )


class EvalConfig(Section):
    size: int | None = Field(None, ge=1, description="defaults to data.eval_size")
    temperature: float = Field(0.0, ge=0, description="0 = greedy accuracy")
    n: int = Field(1, ge=1, description="samples per problem for pass@k")
    k: list[int] = Field(
        default_factory=lambda: [1], description="the k of each pass@k reported (each ≤ eval.n)"
    )

    @model_validator(mode="after")
    def _k_within_n(self) -> EvalConfig:
        check_pass_at_ks(self.k, self.n)
        return self


class LoggingConfig(Section):
    tensorboard: bool = Field(True, description="TensorBoard events in runs/<name>/tensorboard")
    wandb: bool = Field(False, description="also log to Weights & Biases (the wandb extra)")
    wandb_project: str = Field("hone", description="the W&B project (the run is named run.name)")
    progress: bool = Field(True, description="a progress bar (a plain line every 10 steps off a terminal)")
    # Metrics drawn (one panel each, against step) into runs/<name>/curves.png when the run ends;
    # needs matplotlib (the plot extra), skipped with a warning without it.
    plot: list[str] | None = Field(
        None,
        description="metrics drawn into curves.png when the run ends; null = the family's own (a language "
        "model: reward, eval accuracy, entropy, response length, skipped groups, KL; control: returns, "
        "losses and what each algorithm watches); [] draws nothing",
    )
    samples: int = Field(
        0,
        ge=0,
        description="responses written each logged step to runs/<name>/samples.jsonl and TensorBoard: the "
        "first this many rollouts of the step's batch as sampled (prompt order, before any filter); 0 = off",
    )
    samples_every: int = Field(1, ge=1, description="log samples every this many RL steps")
    video: bool = Field(
        False,
        description="control runs: record the deterministic eval episodes as runs/<name>/videos/"
        "step-<N>-episode-<i>.mp4 (the env's rgb_array rendering; the video extra); a warning and no video "
        "where rendering or the writer is missing",
    )
    video_episodes: int = Field(
        1, ge=1, description="with video: record the first this many episodes of each eval"
    )


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
        if self.trainer.world_size > 1 or self.cluster.backend != "local" or self.trainer.mode != "sync":
            raise ValueError(
                "control: runs in one process (trainer.world_size 1, cluster.backend local, trainer.mode "
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

"""The `control:` section: classic control and robotics on gymnasium environments (hone/control/). Its
own module: the environment, the networks and the run's length are common keys; each family of algorithms
reads one subsection of its own (`ppo`, `offpolicy`, `offline`), so a key no algorithm of the run reads is
refused, not ignored. The algorithms themselves are registered in `hone.control.algos`.

Control keys once lived in the language-model sections (`algorithm.gamma`, `trainer.lr`, …) or flat in
`control:` (`control.batch_size`, …): `legacy_key` says where each lives now, and `hone.config.moved`
still reads those spellings, with one line naming the new ones."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from hone.config.base import Section


class ControlPPOConfig(Section):
    """`control.ppo`: PPO's update (Schulman et al. 2017), on one agent or a team (MAPPO/IPPO). Defaults are
    CleanRL's ppo.py."""

    lam: float = Field(0.95, ge=0, le=1, description="GAE's lambda (Schulman et al. 2016)")
    clip: float = Field(
        0.2, gt=0, description="the surrogate's clip range ε (and its low side with clip_high)"
    )
    clip_high: float | None = Field(
        None, gt=0, description="the ratio's upper clip, when it differs from clip; null = clip"
    )
    entropy_coef: float = Field(0.01, ge=0, description="weight of the entropy bonus (CleanRL's ent_coef)")
    epochs: int = Field(
        4, ge=1, description="passes over each rollout (SB3: n_epochs; CleanRL: update_epochs)"
    )
    mini_batches: int = Field(
        4,
        ge=1,
        description="mini-batches per epoch (CleanRL: num_minibatches; SB3's batch_size = rollout / this)",
    )
    grad_clip: float | None = Field(
        0.5,
        gt=0,
        description="clip the gradient's global norm to this (SB3/CleanRL max_grad_norm); null = none",
    )
    value_coef: float = Field(
        1.0,
        ge=0,
        description="weight of the critic's loss, Hone's 0.5·MSE (1.0 = SB3's vf_coef 0.5 on the MSE; "
        "CleanRL's vf_coef 0.5 = 0.5 here)",
    )
    clip_value: float | None = Field(
        None,
        gt=0,
        description="PPO2's value clipping: V within ±this of the rollout's value (CleanRL's clip_vloss, "
        "e.g. 0.1 for Atari); null = the plain squared error (SB3's default)",
    )
    normalize_advantages: bool = Field(
        True, description="whiten the advantages of each mini-batch (SB3, CleanRL)"
    )
    anneal_clip: bool = Field(
        False, description="decay the clip range with the learning rate (zoo's lin_0.2)"
    )
    multi_agent_critic: Literal["centralized", "independent"] = Field(
        "centralized",
        description="with env 'pettingzoo:<module>' (multi-agent, parameters shared by the agents): "
        "centralized = MAPPO (the critic reads the joint observation and the agent's index); "
        "independent = IPPO (each agent's critic reads its own observation)",
    )


class ControlOffPolicyConfig(Section):
    """`control.offpolicy`: SAC and TD3 (and the replay, critics and actor updates the offline learners share
    with them). Defaults are SB3's."""

    buffer_size: int = Field(
        1_000_000, ge=1, description="replay buffer capacity in transitions (oldest overwritten)"
    )
    batch_size: int = Field(256, ge=1, description="transitions sampled per gradient step")
    learning_starts: int = Field(
        100,
        ge=0,
        description="environment steps of uniformly random actions before the first update (SB3)",
    )
    train_freq: int = Field(
        1, ge=1, description="vector-environment steps between updates (SB3's train_freq in steps)"
    )
    gradient_steps: int = Field(1, ge=1, description="gradient steps per update")
    tau: float = Field(0.005, ge=0, le=1, description="Polyak rate of the target networks, θ' ← τθ + (1-τ)θ'")
    init_alpha: float = Field(
        1.0, gt=0, description="the entropy temperature α at the start (SB3's ent_coef 'auto_1.0')"
    )
    autotune: bool = Field(
        True, description="learn α towards target_entropy (Haarnoja et al. 2018b §5); false = α fixed"
    )
    target_entropy: float | None = Field(
        None, description="the entropy target; null = −|A| (minus the action dimension)"
    )
    policy_delay: int | None = Field(
        None,
        ge=1,
        description="critic updates per actor update; null = 2 for td3 (Fujimoto et al.'s d: the "
        "targets follow the actor), 1 for sac (SB3); sac with d > 1 takes d actor (and α) steps each time "
        "(CleanRL's policy_frequency)",
    )
    q_lr: float | None = Field(
        None,
        gt=0,
        description="the critics' learning rate (and sac's α's, as CleanRL's q_lr); null = "
        "trainer.lr (SB3: one learning rate); trainer.lr is the actor's",
    )
    target_noise: float = Field(
        0.2, ge=0, description="target policy smoothing std, in half action ranges (actions in [-1, 1])"
    )
    target_noise_clip: float = Field(
        0.5, ge=0, description="the smoothing noise is clipped to ±this (half action ranges)"
    )
    exploration_noise: float = Field(
        0.1,
        ge=0,
        description="Gaussian exploration noise std on the actor's actions (half action ranges)",
    )
    grad_clip: float | None = Field(
        None, gt=0, description="clip each network's gradient norm to this; null = none (SB3, CleanRL)"
    )


class ControlOfflineConfig(Section):
    """`control.offline`: learning from a Minari dataset (`data.source`): BC, TD3+BC, IQL, AWR, CQL, then
    optionally online fine-tuning; and `hone eval --ope` (fitted-Q evaluation)."""

    updates: int = Field(
        100_000,
        ge=0,
        description="gradient updates on the dataset (before any online_steps)",
    )
    online_steps: int = Field(
        0,
        ge=0,
        description="environment steps of online fine-tuning after the offline updates "
        "(offline-to-online; the replay buffer holds the dataset, then the new steps; one update per step)",
    )
    updates_per_step: int = Field(
        1000,
        ge=1,
        description="gradient updates per RL step (one row of metrics.jsonl) offline",
    )
    holdout: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="share of the dataset's episodes held out (chosen by episode id) for "
        "the val/ metrics (the policy's BC error, the critics' TD error on unseen episodes)",
    )
    dataset_root: str | None = Field(
        None,
        description="the folder holding Minari datasets (as MINARI_DATASETS_PATH); null = Minari's own "
        "(MINARI_DATASETS_PATH, else ~/.minari/datasets)",
    )
    expectile: float = Field(
        0.7, gt=0, lt=1, description="the expectile τ of the value loss (Kostrikov et al. 2021: 0.7)"
    )
    inverse_temperature: float = Field(
        3.0,
        ge=0,
        description="β of the policy's weights exp(β·A) (IQL's MuJoCo value 3.0; AWR's 1/β)",
    )
    max_weight: float = Field(100.0, gt=0, description="the weights exp(β·A) are clipped to this")
    bc_alpha: float = Field(2.5, gt=0, description="α of λ = α / mean|Q| (Fujimoto & Gu 2021: 2.5)")
    cql_alpha: float = Field(5.0, ge=0, description="weight of the conservative penalty in the critics' loss")
    cql_samples: int = Field(
        10, ge=1, description="actions sampled per state for each of uniform, π(s) and π(s')"
    )
    fqe_updates: int = Field(
        20_000, ge=1, description="hone eval --ope: gradient updates of fitted-Q evaluation on the dataset"
    )


class ControlConfig(Section):
    """Classic control and robotics: a policy network trained on a gymnasium environment (instead of a
    language model). One RL step is `rollout_steps` steps of each of `num_envs` environments and its
    updates (sac/td3: updated every `offpolicy.train_freq` of them); see docs/how-to/control.md."""

    algorithm: str = Field(
        "ppo",
        description="a registered control algorithm: ppo (on-policy, GAE; Discrete or Box actions; "
        "MAPPO/IPPO on a pettingzoo env), sac / td3 (off-policy: Box actions, a replay buffer, twin Q "
        "critics), or offline from the Minari dataset data.source: bc, td3_bc, iql, awr, cql",
    )
    env: str = Field(
        description="a registered gymnasium id (CartPole-v1, Pendulum-v1, HalfCheetah-v5, highway-fast-v0), "
        "'pkg.mod:env-id' (import pkg.mod to register it first), 'pkg.mod:Class' (your gymnasium.Env), or "
        "'pettingzoo:<module>' (multi-agent: a module with a PettingZoo parallel_env(), e.g. "
        "pettingzoo:mpe2.simple_spread_v3)"
    )
    env_args: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of gymnasium.make (or of the module's parallel_env)",
    )
    num_envs: int = Field(8, ge=1, description="environments stepped side by side (gymnasium's vector API)")
    vectorization: Literal["sync", "async", "envpool"] = Field(
        "sync",
        description="sync: one process (cheap envs); async: a process per env (costly physics); envpool: "
        "envpool's C++ ports of its own ids (the envpool extra)",
    )
    flatten_obs: bool = Field(
        False,
        description="flatten a multi-dimensional Box observation for the MLP (highway-env's Kinematics)",
    )
    episode_info_keys: list[str] = Field(
        default_factory=list,
        description="info keys of an episode's last step averaged over the last 100 training episodes as "
        "episode/<key> (highway-env: [crashed] = the collision rate)",
    )
    rollout_steps: int = Field(32, ge=1, description="steps per environment per RL step (SB3: n_steps)")
    env_steps: int = Field(
        100_000,
        ge=1,
        description="total environment steps; RL steps = env_steps / (num_envs × rollout_steps)",
    )
    hidden_sizes: list[int] = Field([64, 64], description="the actor's and the critic's MLP hidden layers")
    encoder: Literal["auto", "mlp", "cnn"] = Field(
        "auto",
        description="what reads the observations: mlp (flat vectors), cnn (the Nature-DQN CNN shared by "
        "actor and critic, for uint8 channels-first images), auto = cnn for uint8 (C, H, W) observations",
    )
    atari: bool | None = Field(
        None,
        description="Atari preprocessing (no-op reset, 4-frame skip with max-pool, 84x84 gray, 4 stacked "
        "frames, an episode per life, FIRE at reset, sign-clipped rewards in training); null = on for ale-py "
        "ids (ALE/Breakout-v5, BreakoutNoFrameskip-v4)",
    )
    activation: Literal["tanh", "relu"] = Field("tanh", description="the MLPs' activation")
    normalize_obs: bool = Field(
        False, description="running mean/std observation normalisation (MuJoCo); frozen for eval"
    )
    normalize_reward: bool = Field(False, description="scale rewards by a running std of the return (MuJoCo)")
    clip_obs: float = Field(10.0, gt=0, description="with normalize_obs: clip observations to ±this")
    clip_reward: float = Field(10.0, gt=0, description="with normalize_reward: clip rewards to ±this")
    eval_episodes: int = Field(10, ge=1, description="deterministic episodes per eval (fixed seeds)")
    stop_at_return: float | None = Field(
        None,
        description="end the run once the mean return of the last 100 training episodes reaches this "
        "(SB3's StopTrainingOnRewardThreshold); null = run all env_steps",
    )
    gamma: float = Field(0.99, ge=0, le=1, description="the discount γ")
    lr: float = Field(
        3e-4, gt=0, description="learning rate (Adam); sac/td3: the actor's (offpolicy.q_lr the critics')"
    )
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant",
        description="the learning rate over the run's RL steps after the warm-up (SB3's lin_<lr>: linear)",
    )
    warmup_steps: int = Field(0, ge=0, description="RL steps of linear learning-rate warm-up")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="a plugin algorithm's own hyperparameters (run.plugins), checked against the ones it "
        "declares; the built-in algorithms read their subsection below instead",
    )
    ppo: ControlPPOConfig = Field(default_factory=ControlPPOConfig)
    offpolicy: ControlOffPolicyConfig = Field(default_factory=ControlOffPolicyConfig)
    offline: ControlOfflineConfig = Field(default_factory=ControlOfflineConfig)


# Where control keys moved: (section, key) as a recipe once spelled it -> its place under `control:`.
_SUBSECTION = {
    **{
        k: "ppo"
        for k in ["value_coef", "clip_value", "normalize_advantages", "anneal_clip", "multi_agent_critic"]
    },
    **{
        k: "offpolicy"
        for k in [
            "buffer_size",
            "batch_size",
            "learning_starts",
            "train_freq",
            "gradient_steps",
            "tau",
            "init_alpha",
            "autotune",
            "target_entropy",
            "policy_delay",
            "q_lr",
            "target_noise",
            "target_noise_clip",
            "exploration_noise",
        ]
    },
    **{
        k: "offline"
        for k in [
            "offline_updates",
            "online_steps",
            "updates_per_step",
            "holdout",
            "dataset_root",
            "expectile",
            "inverse_temperature",
            "max_weight",
            "bc_alpha",
            "cql_alpha",
            "cql_samples",
            "fqe_updates",
        ]
    },
}
_FROM_LM_SECTIONS = {
    ("algorithm", "gamma"): ("gamma",),
    ("algorithm", "lam"): ("ppo", "lam"),
    ("algorithm", "clip_low"): ("ppo", "clip"),
    ("algorithm", "clip_high"): ("ppo", "clip_high"),
    ("algorithm", "entropy_coef"): ("ppo", "entropy_coef"),
    ("trainer", "lr"): ("lr",),
    ("trainer", "schedule"): ("schedule",),
    ("trainer", "warmup_steps"): ("warmup_steps",),
    ("trainer", "ppo_epochs"): ("ppo", "epochs"),
    ("trainer", "mini_batches"): ("ppo", "mini_batches"),
    ("trainer", "grad_clip"): ("ppo", "grad_clip"),
}
_DROPPED = {("algorithm", "advantage"): "gae"}  # required once, never read: ppo's advantages are GAE


def legacy_key(keys: list[str], algorithm: str, value: Any) -> list[str] | None:
    """Where a key a control recipe once spelled `keys` (set to `value`) lives now (`["control", "offpolicy",
    "batch_size"]`); `[]` for one that is no longer read (dropped); None for a key that did not move."""
    if len(keys) == 2 and keys[0] == "control" and keys[1] in _SUBSECTION:
        return ["control", _SUBSECTION[keys[1]], "updates" if keys[1] == "offline_updates" else keys[1]]
    path = _FROM_LM_SECTIONS.get((keys[0], keys[-1])) if len(keys) == 2 else None
    if path is not None:
        # sac, td3 and the offline algorithms never read PPO's keys, nor (before) a schedule
        read = algorithm == "ppo" or (path[0] != "ppo" and keys[1] != "schedule")
        return ["control", *path] if read else []
    dropped = len(keys) == 2 and _DROPPED.get((keys[0], keys[1]), object()) == value
    return [] if dropped else None  # algorithm.advantage other than gae: a language-model key, refused


def legacy_keys_in(tree: dict[str, Any]) -> list[list[str]]:
    """The keys of a control recipe's `tree` spelled where they once lived (`hone.config.moved` moves
    them)."""
    control = tree.get("control")
    if not isinstance(control, dict):
        return []
    old_keys = [["control", k] for k in control if k in _SUBSECTION]
    return old_keys + [[s, k] for (s, k) in [*_FROM_LM_SECTIONS, *_DROPPED] if k in (tree.get(s) or {})]

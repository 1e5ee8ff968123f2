"""The algorithm layer: pure tensor functions, registered by name. No I/O, no models.

Shapes: `B` sequences × `T` response positions, right-padded; `response_mask` is 1 on tokens that
count in the loss. Classic control reuses them with `B` environments × `T` rollout steps (`gae` with
episode boundaries); the off-policy actor-critic pieces (`qlearning`: SAC, TD3) and the offline RL
losses (`offline`: BC, TD3+BC, IQL, AWR, CQL) take one row per transition. On-policy distillation
(`distill`) turns a teacher's log-probs of the sampled tokens into per-token advantages.
"""

from hone.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    BATCH_INPUT_BUILDERS,
    discounted_returns,
    group_stats,
    register_advantage,
    register_batch_input,
)
from hone.algorithms.aggregation import AGGREGATION_MODES, aggregate_loss
from hone.algorithms.distill import DISTILL_MODES, distill_advantages, register_distill
from hone.algorithms.kl import KL_ESTIMATORS, register_kl
from hone.algorithms.losses import POLICY_LOSSES, register_policy_loss
from hone.algorithms.metrics import pass_at_k
from hone.algorithms.offline import (
    advantage_weights,
    bc_loss,
    cql_penalty,
    expectile_loss,
    iql_q_target,
    td3_bc_actor_loss,
    weighted_regression_loss,
)
from hone.algorithms.offpolicy import OFF_POLICY_CORRECTIONS, Correction, register_off_policy
from hone.algorithms.preference import (
    DEFAULT_BETA,
    PREFERENCE_LOSSES,
    REFERENCE_FREE,
    PreferenceLoss,
    bradley_terry_loss,
    register_preference_loss,
)
from hone.algorithms.qlearning import (
    polyak_update,
    q_loss,
    sac_actor_loss,
    sac_alpha_loss,
    sac_critic_target,
    smoothed_target_action,
    tanh_gaussian_log_prob,
    td3_actor_loss,
    td3_target,
)
from hone.algorithms.turns import gigpo, turn_grpo, turn_reinforce, turn_returns
from hone.algorithms.utils import (
    masked_mean,
    masked_sum,
    masked_whiten,
    scores_to_token_rewards,
    sequence_scores,
    turn_means,
    turn_sums,
)
from hone.algorithms.value import explained_variance, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATION_MODES",
    "BATCH_INPUT_BUILDERS",
    "DEFAULT_BETA",
    "DISTILL_MODES",
    "KL_ESTIMATORS",
    "OFF_POLICY_CORRECTIONS",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "REFERENCE_FREE",
    "Correction",
    "PreferenceLoss",
    "advantage_weights",
    "aggregate_loss",
    "bc_loss",
    "bradley_terry_loss",
    "cql_penalty",
    "discounted_returns",
    "distill_advantages",
    "expectile_loss",
    "explained_variance",
    "gigpo",
    "group_stats",
    "iql_q_target",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "pass_at_k",
    "polyak_update",
    "q_loss",
    "register_advantage",
    "register_batch_input",
    "register_distill",
    "register_kl",
    "register_off_policy",
    "register_policy_loss",
    "register_preference_loss",
    "sac_actor_loss",
    "sac_alpha_loss",
    "sac_critic_target",
    "scores_to_token_rewards",
    "sequence_scores",
    "smoothed_target_action",
    "tanh_gaussian_log_prob",
    "td3_actor_loss",
    "td3_bc_actor_loss",
    "td3_target",
    "turn_grpo",
    "turn_means",
    "turn_reinforce",
    "turn_returns",
    "turn_sums",
    "value_loss",
    "weighted_regression_loss",
]

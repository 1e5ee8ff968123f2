"""The trainable side: the policy and its log-probs, checkpoints, supervised warm-up, and preference
training (DPO and reward models)."""

from hone.training.checkpoint import Checkpointer
from hone.training.dpo import DPOSettings, run_dpo
from hone.training.policy import LoraSettings, Policy
from hone.training.reward_model import RMSettings, run_reward_model
from hone.training.sft import collate_sft, encode_pair, run_sft, sft_loss

__all__ = [
    "Checkpointer",
    "DPOSettings",
    "LoraSettings",
    "Policy",
    "RMSettings",
    "collate_sft",
    "encode_pair",
    "run_dpo",
    "run_reward_model",
    "run_sft",
    "sft_loss",
]

"""The trainable side: the policy and its log-probs, checkpoints, and supervised warm-up."""

from hone.training.checkpoint import Checkpointer
from hone.training.policy import LoraSettings, Policy
from hone.training.sft import collate_sft, encode_pair, run_sft, sft_loss

__all__ = [
    "Checkpointer",
    "LoraSettings",
    "Policy",
    "collate_sft",
    "encode_pair",
    "run_sft",
    "sft_loss",
]

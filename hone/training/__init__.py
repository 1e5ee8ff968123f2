"""The trainable side: the policy and its log-probs, checkpoints, the optimizer pieces, supervised warm-up,
and preference training (DPO and reward models).

The names below load on first use (PEP 562): `hone.training.optim` or `hone.training.checkpoint` alone
(what a control run needs) must not import transformers through this package."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hone.training.checkpoint import Checkpointer
    from hone.training.dpo import DPOSettings, run_dpo
    from hone.training.policy import LoraSettings, Policy
    from hone.training.reward_model import RMSettings, run_reward_model
    from hone.training.sft import collate_sft, encode_pair, run_sft, sft_loss

_WHERE = {
    "Checkpointer": "checkpoint",
    "DPOSettings": "dpo",
    "run_dpo": "dpo",
    "LoraSettings": "policy",
    "Policy": "policy",
    "RMSettings": "reward_model",
    "run_reward_model": "reward_model",
    "collate_sft": "sft",
    "encode_pair": "sft",
    "run_sft": "sft",
    "sft_loss": "sft",
}

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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hone.training' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hone.training.{_WHERE[name]}"), name)

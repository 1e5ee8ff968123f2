"""A plugin module, imported through `run.plugins`, that registers a new advantage estimator."""

from __future__ import annotations

import torch

from hone.algorithms import ADVANTAGE_ESTIMATORS, register_advantage

if "plugin_sign" not in ADVANTAGE_ESTIMATORS:

    @register_advantage("plugin_sign")
    def plugin_sign(*, token_rewards: torch.Tensor, response_mask: torch.Tensor, **_: object):
        adv = torch.sign(token_rewards.sum(-1, keepdim=True)) * response_mask
        return adv, adv.clone()

"""The KL reference of a LoRA run, scored by the policy's own model with the adapter disabled or swapped."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from hone.training.policy import Policy


class AdapterReference(Policy):
    """The reference policy of a LoRA run, scored by the policy's own model (no second copy of the base).

    With `adapter=None` it is the base model: every forward runs under peft's `disable_adapter()`. With
    an adapter state (the warm-start SFT's adapter, where RL started) that state is swapped into the
    adapter for the forward and the trained one swapped back after, bit for bit. Scoring only, never
    under grad: the swap writes the trainable tensors in place.
    """

    def __init__(self, policy: Policy, adapter: dict[str, torch.Tensor] | None = None) -> None:
        if not policy.is_lora:
            raise ValueError("AdapterReference needs a LoRA policy")
        super().__init__(policy.model, policy.tokenizer, policy.processor)
        self.adapter = adapter

    @contextmanager
    def _active(self) -> Iterator[None]:
        if self.adapter is None:
            with self.peft_model().disable_adapter():
                yield
            return
        trained = self.adapter_state()
        self.load_adapter_state(self.adapter, "the reference")
        try:
            yield
        finally:
            self.load_adapter_state(trained, "the trained policy")

    def token_log_probs(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        if torch.is_grad_enabled():
            raise RuntimeError("the LoRA reference scores under torch.no_grad() only")
        with self._active():
            return super().token_log_probs(*args, **kwargs)

    def weights(self) -> dict[str, torch.Tensor]:
        """The tensors that define the reference: the frozen base, plus the swapped-in adapter if any."""
        base = {k: v for k, v in self.model.state_dict().items() if ".lora_" not in k}
        return base | {f"adapter.{k}": v for k, v in (self.adapter or {}).items()}

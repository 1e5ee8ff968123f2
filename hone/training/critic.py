"""PPO's critic: a value model V(s_t) on every response position, and its own optimizer and update.

`ValueModel` is the policy's architecture without the LM head (`AutoModel`, the transformer trunk) plus a
`Linear(hidden, 1)` value head. A trunk and our own head, rather than `AutoModelForTokenClassification`:
it loads from any causal-LM directory (not every architecture has a token-classification class), and
the head is ours to initialise at zero, so the first values are exactly 0 and the first advantages are
the rewards' (no random baseline noise while the trunk is the policy's). Saved as the trunk's HF
directory plus `value_head.safetensors`, which `critic.path` can load again.

`CriticTrainer.update` regresses V on the batch's returns (`hone.algorithms.value_loss`, PPO2 clipping
optional): a second optimizee of the RL update's loop (`hone.training.ppo`), `trainer.ppo_epochs` x
`trainer.mini_batches` optimizer steps over the policy's `TrainBatch`, with its own optimizer, grad clip
and mini-batch seed; its LR follows its own schedule over the RL steps (`RLSchedule`, no warm-up: the
critic's `warmup_steps` are steps during which only the critic trains, see the learner).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel

from hone.algorithms import value_loss
from hone.config import CriticConfig, TrainerConfig
from hone.models.vision import rope_positions, text_config
from hone.training.distributed import Ranks
from hone.training.optim import OptimizerStepper, RLSchedule, adamw
from hone.training.policy import DType, disable_dropout
from hone.training.ppo import Optimizee
from hone.types import TrainBatch, VisionBatch

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """A transformer trunk and a scalar head: `forward(ids, mask) -> [B, L]` values, one per position."""

    trunk: PreTrainedModel  # declared, so `nn.Module`'s attribute typing does not hide its methods

    def __init__(self, trunk: PreTrainedModel, head: nn.Linear) -> None:
        super().__init__()
        self.trunk = trunk
        self.head = head

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: DType, device: torch.device) -> ValueModel:
        """The trunk of the model at `path`; its saved value head if `path` is a saved critic, else a
        zero-initialised one (V = 0 everywhere until the critic learns)."""
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        trunk = AutoModel.from_pretrained(str(path), dtype=torch_dtype)
        trunk.config.use_cache = False
        head = nn.Linear(text_config(trunk.config).hidden_size, 1, dtype=trunk.dtype)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        model = cls(trunk, head).to(device)
        saved_head = Path(path) / VALUE_HEAD_FILE
        if saved_head.is_file():
            model.head.load_state_dict(load_file(saved_head, device=str(device)))
        return model

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: VisionBatch | None = None
    ) -> torch.Tensor:
        images: dict[str, torch.Tensor] = {}
        if vision is not None and vision.image_grid_thw.numel():  # a VLM trunk: as `Policy._score`
            vision = vision.to(input_ids.device)
            position_ids = rope_positions(self.trunk, input_ids, attention_mask, vision.image_grid_thw)
            images = {"pixel_values": vision.pixel_values, "image_grid_thw": vision.image_grid_thw}
        else:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.trunk(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **images,
        ).last_hidden_state
        return self.head(hidden).squeeze(-1).float()

    def values(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mask: torch.Tensor,
        vision: VisionBatch | None = None,
    ) -> torch.Tensor:
        """V(s_t), `[b, T]` aligned with a batch's response columns: column t is the value of the state
        that produces token t + 1 (the prefix up to position t); 0 off `mask`. `vision`: the rows' images."""
        return self(input_ids, attention_mask, vision)[:, :-1] * mask

    def save_pretrained(
        self, directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None
    ) -> None:
        """The trunk as an HF directory (what `critic.path` loads) plus `value_head.safetensors`.
        `state_dict`: the whole model's state gathered from N learner ranks, written instead of its own."""
        directory = Path(directory)
        state = state_dict if state_dict is not None else self.state_dict()
        trunk = {k.removeprefix("trunk."): v for k, v in state.items() if k.startswith("trunk.")}
        self.trunk.save_pretrained(directory, state_dict=trunk if state_dict is not None else None)
        head = {
            k.removeprefix("head."): v.detach().contiguous()
            for k, v in state.items()
            if k.startswith("head.")
        }
        save_file(head, directory / VALUE_HEAD_FILE)

    def load_weights(self, directory: str | Path) -> None:
        """Restore trunk and head from a `save_pretrained` directory into this (same-shaped) model."""
        directory = Path(directory)
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(directory.glob("*.safetensors")):
            if shard.name != VALUE_HEAD_FILE:
                state.update(load_file(shard, device=str(self.device)))
        self.trunk.load_state_dict(state, strict=True)
        self.head.load_state_dict(load_file(directory / VALUE_HEAD_FILE, device=str(self.device)))


class CriticTrainer(Optimizee):
    """The critic's values for a batch (no grad), and the critic as the RL update's second optimizee: its
    regression on the batch's returns."""

    shuffle = "critic-shuffle"

    def __init__(
        self,
        model: ValueModel,
        cfg: CriticConfig,
        trainer: TrainerConfig,
        *,
        total_rl_steps: int,
        seed: int = 0,
        ranks: Ranks | None = None,
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.trainer_cfg = trainer
        if trainer.disable_dropout:  # values computed in eval mode and trained on must be the same function
            disable_dropout(model)
        params = [p for p in model.parameters() if p.requires_grad]
        stepper = OptimizerStepper(
            adamw(
                params,
                lr=cfg.lr,
                betas=trainer.betas,
                weight_decay=cfg.weight_decay,
                fused=trainer.fused_adamw,
            ),
            params,
            grad_clip=cfg.grad_clip,
            max_nonfinite_steps=trainer.max_nonfinite_steps,
            limit_key="trainer.max_nonfinite_steps",
            advice="the last checkpoint is intact. Look for NaN/inf in rewards or returns, or lower "
            "critic.lr",
        )
        super().__init__(stepper, RLSchedule(cfg.schedule, 0, total_rl_steps), seed, ranks=ranks)

    def _micro_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return rows.split(self.cfg.micro_batch_size or self.trainer_cfg.micro_batch_size)

    @torch.no_grad()
    def values(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_mask: torch.Tensor,
        vision: VisionBatch | None = None,
    ) -> torch.Tensor:
        """V(s_t) `[B, T]` for every response position (`response_mask`) of a batch (0 elsewhere)."""
        self.model.eval()
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        return torch.cat(
            [
                self.model.values(
                    input_ids[r],
                    attention_mask[r],
                    response_mask[r],
                    None if vision is None else vision.select(r),
                )
                for r in self._micro_rows(rows)
            ]
        )

    def _micro_losses(
        self, batch: TrainBatch, mini: torch.Tensor, sums: dict[str, float]
    ) -> Iterator[torch.Tensor]:
        """Each micro-batch's value loss (x `value_coef`) of mini-batch `mini`, divided by the mini-batch's
        token count so they add up to its mean; lazily, one graph at a time. Adds metrics to `sums`."""
        assert batch.values is not None  # checked by update
        num_tokens = batch.loss_mask[mini].sum()
        size = self.cfg.micro_batch_size or self.trainer_cfg.micro_batch_size
        for rows, padding in self.ranks.micro_batches(mini, size):  # on N ranks: this rank's share
            mask = batch.loss_mask[rows]
            loss, metrics = value_loss(
                self.model.values(
                    batch.input_ids[rows],
                    batch.attention_mask[rows],
                    mask,
                    None if batch.vision is None else batch.vision.select(rows),
                ),
                batch.values[rows],
                batch.returns[rows],
                mask,
                clip=self.cfg.value_clip,
                num_tokens=num_tokens,
            )
            if not padding:
                sums["loss/value"] += float(loss.detach())
                sums["clip_frac"] += float(metrics["clip_frac"])
                sums["tokens"] += float(mask.sum())
            yield self.ranks.weigh(self.cfg.value_coef * loss, padding)

    def update(self, batch: TrainBatch, step: int) -> dict[str, float]:
        """Regress V on `batch.returns`, clipped around `batch.values` (the values GAE used) when
        `critic.value_clip` is set, in the RL update's loop (`hone.training.ppo.optimize`). Metrics:
        `value/loss` (mean over the applied optimizer steps, before `value_coef`), `value/clip_frac` (per
        trained token), `value/grad_norm`, `value/lr`, `value/nonfinite_steps` (optimizer steps skipped for
        a NaN/inf gradient norm)."""
        if batch.values is None:
            raise ValueError("CriticTrainer.update needs a batch with the critic's values")
        self.model.train()
        lr = self.cfg.lr * self.schedule.factor(step)
        steps = self.optimize(
            lambda mini, _, sums: self._micro_losses(batch, mini, sums),
            batch,
            cfg=self.trainer_cfg,
            lr=lr,
            where=f"RL step {step + 1} (critic)",
        )
        out = {"value/nonfinite_steps": float(steps.skipped)}
        if not steps.grad_norms:
            return out
        means = steps.means()
        return out | {
            "value/loss": means["loss/value"],
            "value/clip_frac": means["clip_frac"],
            "value/grad_norm": means["grad_norm"],
            "value/lr": lr,
        }

"""The one RL update loop: epochs x mini-batches x micro-batches, for every model the update trains.

An RL update (PPO's, Schulman et al. 2017, and every loss of `hone.algorithms` that reuses its shape)
makes `ppo_epochs` passes over the batch, each split into `mini_batches` optimizer steps (shuffled with
a seed per update), each accumulated over micro-batches by the optimizer step shared with the offline
loop (`OptimizerStepper.step(losses, where)`: losses taken lazily, so one micro-batch graph is alive at
a time). `Optimizee.optimize` runs that loop for one optimizee: the policy (`RLTrainer`, its loss a sum
of named `LossTerm`s) and PPO's critic (`CriticTrainer`, the value loss) are two optimizees of it over
the same `TrainBatch`, each with its own optimizer, LR schedule, gradient clip and mini-batch seed.

Every micro-batch loss is divided by the counts of its whole *mini-batch*, so accumulation gives exactly
the mini-batch gradient whatever the micro-batch size. A step with a non-finite gradient norm is skipped
(weights and moments untouched) and its metrics dropped: a skipped step's NaN loss says nothing about the
update that happened.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from hone.config import TrainerConfig
from hone.seeding import derive_seed
from hone.training.distributed import Ranks
from hone.training.optim import OptimizerStepper, RLSchedule
from hone.types import TrainBatch


def micro_batch_rows(cfg: TrainerConfig, width: int) -> int:
    """Rows per forward/backward: at most `micro_batch_size`, and at most `micro_batch_tokens` padded tokens
    (the logits are `rows x width x vocab`: a 150k vocabulary makes rows x width the memory that counts)."""
    return max(1, min(cfg.micro_batch_size, cfg.micro_batch_tokens // max(width, 1)))


@dataclass(frozen=True)
class MicroBatch:
    """What a loss term sees of one forward/backward: the rows of the batch, the policy's log-probs (and
    entropy) on them, and the counts of the whole mini-batch they belong to, by which every term divides
    so the micro-batch losses of an optimizer step sum to its mini-batch loss."""

    batch: TrainBatch
    rows: torch.Tensor  # indices into the batch
    mask: torch.Tensor  # [b, T] loss mask of these rows
    log_probs: torch.Tensor  # [b, T], with grad
    entropy: torch.Tensor | None  # [b, T]; with grad only when the entropy bonus is on
    counts: dict[str, Any]  # num_tokens and num_seqs of the mini-batch, norm_len (aggregate_loss keywords)
    # [b, T] the off-policy correction's weight x keep per token (detached), multiplying the policy loss's
    # per-token terms; None when no correction applies
    token_weights: torch.Tensor | None = None


# A loss term: (its contribution to the loss, metrics). Metrics named "loss/..." are summed per optimizer
# step and reported as the mean over applied steps; every other metric is a sum over this micro-batch's
# trained tokens, reported per trained token (`Steps.means`).
LossTerm = Callable[[MicroBatch], tuple[torch.Tensor, dict[str, float]]]

# `micro_losses(mini, k, sums)`: the loss of each micro-batch of mini-batch `mini` (row indices; the k-th
# optimizer step of the update), lazily; adds that step's metrics to `sums` (with "tokens", the trained
# tokens, for the per-token ones).
MicroLosses = Callable[[torch.Tensor, int, dict[str, float]], Iterator[torch.Tensor]]


def mini_batches(rows: int, *, epochs: int, splits: int, seed: int) -> Iterator[torch.Tensor]:
    """Row indices of each optimizer step: `epochs` passes over `rows` rows, each split into `splits`,
    shuffled when there is more than one step (from `seed`, one per update and optimizee, so a resumed
    run shuffles exactly like an uninterrupted one)."""
    generator = torch.Generator().manual_seed(seed)
    shuffle = epochs > 1 or splits > 1
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator) if shuffle else torch.arange(rows)
        yield from order.tensor_split(min(splits, rows))


@dataclass
class Steps:
    """What the optimizer steps of one update did: metric sums over the applied steps, their gradient
    norms, and how many were skipped for a non-finite norm."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    grad_norms: list[float] = field(default_factory=list)
    skipped: int = 0

    def means(self) -> dict[str, float]:
        """The metrics of the applied steps: those named "loss/..." per step, the rest per trained token,
        and the mean gradient norm (call only when a step applied)."""
        applied = len(self.grad_norms)
        sums = dict(self.sums)
        tokens = max(sums.pop("tokens", 0.0), 1.0)
        out = {key: value / (applied if key.startswith("loss/") else tokens) for key, value in sums.items()}
        out["grad_norm"] = sum(self.grad_norms) / applied
        return out


class Optimizee:
    """One model an RL update trains (the policy's `RLTrainer`, PPO's `CriticTrainer`): its optimizer step,
    its LR schedule over the RL steps, and its count of updates, which seeds its mini-batch order (under
    its own name, `shuffle`, so each keeps its own draws). Its `state_dict` is what a checkpoint keeps of
    it beside its weights and optimizer."""

    shuffle = "minibatch-shuffle"

    def __init__(
        self, stepper: OptimizerStepper, schedule: RLSchedule, seed: int, *, ranks: Ranks | None = None
    ) -> None:
        self.stepper = stepper
        self.schedule = schedule
        self.seed = seed
        self.updates = 0
        self.ranks = ranks or Ranks()  # N learner ranks: each trains its share of every mini-batch

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.stepper.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.stepper.optimizer = optimizer

    def optimize(
        self, micro_losses: MicroLosses, batch: TrainBatch, *, cfg: TrainerConfig, lr: float, where: str
    ) -> Steps:
        """This optimizee's part of an RL update: `cfg.ppo_epochs` x `cfg.mini_batches` optimizer steps at
        learning rate `lr`, each over the micro-batch losses `micro_losses` yields. `where` (e.g. "RL step
        4") locates a non-finite-gradient error."""
        lr = self.ranks.same(lr)  # under a time limit the LR follows a clock: rank 0's, on every rank
        self.stepper.set_lr(lr)
        steps = Steps()
        seed = derive_seed(self.seed, self.shuffle, self.updates)
        minis = mini_batches(batch.rows, epochs=cfg.ppo_epochs, splits=cfg.mini_batches, seed=seed)
        for k, mini in enumerate(minis):
            sums: dict[str, float] = defaultdict(float)
            norm = self.stepper.step(micro_losses(mini.to(batch.input_ids.device), k, sums), where=where)
            if not math.isfinite(norm):  # the norm is the global one: every rank skips alike
                steps.skipped += 1
                continue
            steps.grad_norms.append(norm)
            for key, value in self.ranks.sum_metrics(sums).items():
                steps.sums[key] += value
        self.updates += 1
        return steps

    def state_dict(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "lr_progress": self.schedule.progress,
            "nonfinite_streak": self.stepper.nonfinite_streak,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        # Checkpoints from before these fields: a step-clocked schedule and no streak.
        self.schedule.progress = float(state.get("lr_progress", 0.0))
        self.stepper.nonfinite_streak = int(state.get("nonfinite_streak", 0))

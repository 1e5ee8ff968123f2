"""The optimizer-step loop of the pairwise trainers (`hone dpo`, `hone rm`): AdamW with an LR schedule, a
seeded epoch order of pairs, gradient accumulation over micro-batches, a wall-clock deadline, and per-step
metrics averaged over the batch. Each trainer supplies only its micro-batch losses (and, for the reward
model, a held-out check after some steps)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from hone.training.optim import adamw_stepper, epoch_batches
from hone.training.trainer import build_scheduler

Stats = list[dict[str, torch.Tensor]]  # per micro-batch, per-pair metric tensors, filled by `batch_losses`


class StepSettings(Protocol):
    lr: float
    weight_decay: float
    grad_clip: float | None
    max_nonfinite_steps: int
    schedule: str
    warmup_steps: int
    steps: int
    batch_size: int
    seed: int


def run_pair_steps(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    n_pairs: int,
    settings: StepSettings,
    batch_losses: Callable[[list[int], Stats], Iterator[torch.Tensor]],
    *,
    name: str,
    advice: str,
    log: Callable[[dict[str, float]], None] | None = None,
    deadline: float | None = None,
    after_step: Callable[[int], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """`settings.steps` optimizer steps (or until `deadline`, a `time.perf_counter()` value checked before
    each): `batch_losses(pair indices, stats)` yields each micro-batch's loss and appends its per-pair
    metrics to `stats`; `after_step(step)` may add metrics (an eval). `log` gets each step's metrics plus
    `learning_rate` and `grad_norm`. Returns `{"steps", "out_of_time"}` and the last step's metrics."""
    optimizer, stepper = adamw_stepper(
        params,
        lr=settings.lr,
        weight_decay=settings.weight_decay,
        grad_clip=settings.grad_clip,
        max_nonfinite_steps=settings.max_nonfinite_steps,
        advice=advice,
    )
    scheduler = build_scheduler(optimizer, settings.schedule, settings.warmup_steps, settings.steps)
    batches = epoch_batches(n_pairs, settings.batch_size, settings.seed)
    result: dict[str, Any] = {"steps": 0, "out_of_time": False}
    was_training = model.training
    model.train()
    try:
        for step in range(1, settings.steps + 1):
            if deadline is not None and time.perf_counter() > deadline:
                result["out_of_time"] = True
                break
            lr = scheduler.get_last_lr()[0]
            stats: Stats = []
            grad_norm = stepper.step(batch_losses(next(batches), stats), where=f"{name} step {step}")
            scheduler.step()
            metrics = {key: torch.cat([s[key] for s in stats]).mean().item() for key in stats[0]}
            metrics |= {"learning_rate": lr, "grad_norm": grad_norm}
            if after_step is not None:
                metrics |= after_step(step)
            result.update(steps=step, **metrics)
            if log is not None:
                log({"step": step, **metrics})
    finally:
        model.train(was_training)
    return result

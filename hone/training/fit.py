"""The one offline training loop (`fit`), shared by SFT, DPO and reward models.

An offline trainer differs from another only in its micro-batch losses (and its data and collation), so
everything else is written once here: AdamW and RL's optimizer step (`hone.training.optim`: gradient
accumulation, clipping, non-finite steps skipped), the LR schedule (warm-up, then constant/cosine/linear
over `steps`), a seeded epoch order of examples, a wall-clock deadline, per-step metrics, an `after_step`
hook (SFT's periodic evaluation and stop-at-accuracy, the reward model's held-out check), and the
model's train/eval mode put back as it was found.

Checkpoints (`FitSaves`, one learner rank): the command passes in how to save and restore through its run
directory (`training` knows no run), and `fit` adds what it owns: the optimizer, the LR schedule and the
non-finite streak, the step (which places the seeded epoch order) and the RNG. Saved every `every` steps,
at the step training stops, and when an interrupt (Ctrl-C, SIGTERM) lands at a step boundary or inside a
step's forward and backward passes, before its update: the weights are then still the last step's. A run
started from such a checkpoint ends with the weights an unbroken one has, bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from hone.signals import raise_if_signalled
from hone.training.checkpoint import RNG, RNG_FILE, Part
from hone.training.distributed import ONE_RANK, Ranks
from hone.training.optim import adamw_stepper, build_scheduler, epoch_batches

# Per micro-batch, what the loss function reports of it (per-example metric tensors, or anything the
# trainer's `metrics` function reads), filled while `losses` runs.
Stats = list[dict[str, Any]]

# `losses(example indices, stats)`: each micro-batch's loss, already divided by its whole step's count so
# the losses sum to the step's loss; lazily, so one micro-batch graph is alive at a time.
Losses = Callable[[list[int], Stats], Iterator[torch.Tensor]]

# `metrics(indices, stats, lr, grad_norm)`: the step's row of metrics.
StepMetrics = Callable[[list[int], Stats, float, float], dict[str, float]]

# `after_step(step, metrics)`: runs with the model in eval mode after each optimizer step (1-based); returns
# metrics to add to the step's row and whether to stop training.
AfterStep = Callable[[int, dict[str, float]], tuple[dict[str, float], bool]]


@dataclass(frozen=True)
class FitPlan:
    """What `fit` reads: the optimizer, LR schedule, batches and steps of an offline trainer. DPO's and the
    reward model's settings extend it with their own (`DPOSettings`, `RMSettings`)."""

    steps: int = 100
    batch_size: int = 8
    micro_batch_size: int | None = None  # rows per forward/backward; None: the whole batch at once
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: str = "linear"
    grad_clip: float | None = 1.0
    max_nonfinite_steps: int = 3
    seed: int = 0


@dataclass
class FitSaves:
    """How `fit` checkpoints, given by the command that owns the run directory (one learner rank).

    `save(step, parts)` writes a checkpoint (the run's `Checkpointer.save`); `model` names the model's
    parts (e.g. `{"model/": policy}`), saved first; `extra` adds JSON parts of the caller's (e.g. an
    eval before training). `every`: the cadence in optimizer steps (0: only where training stops).
    `restore(parts)`, resuming: loads the checkpoint into `fit`'s own parts and returns its state.json;
    the caller loaded the model already (before it wrote anything). `after(step, row)` runs after each
    step once it is logged and saved (`run.callbacks`; a KeyboardInterrupt there stops as Ctrl-C)."""

    save: Callable[[int, dict[str, Part]], object]
    model: dict[str, Part]
    every: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    restore: Callable[[dict[str, Part]], Mapping[str, Any]] | None = None
    after: Callable[[int, dict[str, float]], object] | None = None


class _Boundary:
    """Where training last stood between steps: the step, and the RNG there (a step's dropout draws from
    it before the step can be undone). `clean` while the weights, optimizer and schedule are still that
    step's: from the end of its bookkeeping until the next step's update begins (all its backward passes
    done). Saved as the `fit` part (the schedule's and stepper's state) and the RNG snapshot."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LRScheduler, stepper: Any) -> None:
        self.scheduler, self.stepper = scheduler, stepper
        self.step, self.clean = 0, False
        self.rng: dict[str, Any] = {}

    def mark(self, step: int) -> None:
        self.rng = RNG.state_dict()
        self.step, self.clean = step, True

    def guard(self, losses: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
        yield from losses
        self.clean = False  # every backward has run: the update follows

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(), "nonfinite_streak": self.stepper.nonfinite_streak}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.stepper.nonfinite_streak = int(state["nonfinite_streak"])


class _RNGAt:
    """The RNG as it was at the boundary (`_Boundary.rng`), as the checkpoint's `rng.pt` part."""

    def __init__(self, boundary: _Boundary) -> None:
        self.boundary = boundary

    def state_dict(self) -> dict[str, Any]:
        return self.boundary.rng

    def load_state_dict(self, state: dict[str, Any]) -> None:
        RNG.load_state_dict(state)


@dataclass
class FitResult:
    steps: int = 0  # optimizer steps taken (skipped non-finite ones included: the schedule counts them)
    out_of_time: bool = False  # the deadline stopped training
    stopped: bool = False  # `after_step` stopped training
    metrics: dict[str, float] = field(default_factory=dict)  # the last step's row (hook's metrics included)


def mean_metrics(indices: list[int], stats: Stats, lr: float, grad_norm: float) -> dict[str, float]:
    """The pairwise trainers' row (TRL's names): each per-pair metric averaged over the step's pairs, plus
    `learning_rate` and `grad_norm`."""
    means = {key: torch.cat([s[key] for s in stats]).mean().item() for key in stats[0]}
    return means | {"learning_rate": lr, "grad_norm": grad_norm}


def fit(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    n_examples: int,
    settings: FitPlan,
    losses: Losses,
    *,
    name: str,
    advice: str,
    metrics: StepMetrics = mean_metrics,
    after_step: AfterStep | None = None,
    log: Callable[[dict[str, float]], None] | None = None,
    deadline: float | None = None,
    ranks: Ranks = ONE_RANK,
    saves: FitSaves | None = None,
) -> FitResult:
    """Train `model` in place for `settings.steps` optimizer steps over `n_examples` examples.

    Each step takes `settings.batch_size` example indices (reshuffled every epoch with `settings.seed`,
    `epoch_batches`) and steps on `losses(indices, stats)`; a step with a non-finite gradient norm is
    skipped (the schedule still advances, as RL's does) and `max_nonfinite_steps` in a row raise
    `NonFiniteGradientError`, whose line ends with `advice` and names the step as "`name` step N".
    `metrics` makes the step's row from `stats` (with the LR the step used and its gradient norm), then
    `after_step` may add to it or stop; `log` receives the row with its `step`.

    `deadline` (a `time.perf_counter()` value) is checked before every step and before every `after_step`
    (an evaluation can cost as much as many steps): past it, training stops at once, so it overruns the
    deadline by at most one step or one hook.

    On N learner `ranks` every rank calls `fit` with the same examples and settings: `losses` yields this
    rank's share of each step (`Ranks.micro_batches`, `Ranks.weigh`), the step's `stats` are gathered from
    every rank before `metrics`, and rank 0's clock decides the deadline for all. `after_step` runs on every
    rank and must return the same there (a held-out forward every rank makes, or rank 0's result shared).

    `saves`: checkpoints, and a resume from one (`FitSaves`; one rank only). A resumed run's steps go on
    from the checkpoint's, numbered as an unbroken run's.
    """
    if saves is not None and ranks.world > 1:
        raise ValueError("fit's checkpoints take one learner rank (N ranks save no offline checkpoints yet)")
    optimizer, stepper = adamw_stepper(
        params,
        lr=settings.lr,
        weight_decay=settings.weight_decay,
        grad_clip=settings.grad_clip,
        max_nonfinite_steps=settings.max_nonfinite_steps,
        advice=advice,
    )
    scheduler = build_scheduler(optimizer, settings.schedule, settings.warmup_steps, settings.steps)
    boundary = _Boundary(scheduler, stepper)
    own: dict[str, Part] = {"optimizer.pt": optimizer, "fit": boundary, RNG_FILE: _RNGAt(boundary)}
    start = 0
    if saves is not None and saves.restore is not None:
        start = int(saves.restore(own)["step"])
    saved = start
    batches = epoch_batches(n_examples, settings.batch_size, settings.seed, start=start)
    result = FitResult(steps=start)

    def out_of_time() -> bool:
        passed = deadline is not None and time.perf_counter() > deadline
        result.out_of_time = bool(ranks.same(float(passed))) if ranks.world > 1 else passed
        return result.out_of_time

    def save(step: int) -> None:
        nonlocal saved
        assert saves is not None
        saves.save(step, {**saves.model, **saves.extra, **own})  # the RNG last
        saved = step

    was_training = model.training
    model.train()
    if saves is not None:
        boundary.mark(start)
    try:
        for step in range(start + 1, settings.steps + 1):
            raise_if_signalled()
            if out_of_time():
                break
            indices = next(batches)
            lr = float(scheduler.get_last_lr()[0])
            stats: Stats = []
            losses_ = losses(indices, stats)
            grad_norm = stepper.step(
                losses_ if saves is None else boundary.guard(losses_), where=f"{name} step {step}"
            )
            scheduler.step()
            row = metrics(indices, ranks.gather_stats(stats), lr, grad_norm)
            result.steps, result.metrics = step, row
            if after_step is not None and not out_of_time():
                model.eval()
                added, result.stopped = after_step(step, row)
                model.train()
                row |= added
            if log is not None:
                log({"step": step, **row})
            if saves is None:
                if result.out_of_time or result.stopped:
                    break
                continue
            boundary.mark(step)
            last = step == settings.steps or result.out_of_time or result.stopped
            if last or (saves.every and step % saves.every == 0):
                save(step)
            if saves.after is not None:
                saves.after(step, row)
            if last:
                break
        if saves is not None and result.steps > saved:  # the deadline stopped training before a step
            save(result.steps)
    except KeyboardInterrupt:
        # Between steps, or inside a step's forward and backward passes: the weights, optimizer and
        # schedule are still the last step's, so its checkpoint is exact (with the RNG as it was there).
        if saves is not None and boundary.clean and boundary.step > saved:
            save(boundary.step)
        raise
    finally:
        model.train(was_training)
    return result

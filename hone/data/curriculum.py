"""The run's prompt curriculum: a scheduler (`data.scheduler`), the per-prompt pass rates it reads and
the difficulty filter (`data.difficulty_filter`), with the state a checkpoint needs.

The loop calls `batch(step)` as it submits a step and `observe(step, outcomes)` as it takes the step's
results, both in step order and both in the loop's thread, so what is drawn depends on the order of
steps alone, never on producer timing. In async mode step s is drawn once the learner has finished
s − η steps, so it sees results up to step s − η − 1: late, and deterministic. Batches already drawn but
not yet observed are part of the state: a run resumed at step k is handed the batches of k … k + η − 1
the unbroken run drew, and draws k + η from the same state the unbroken one did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hone.config import DataConfig
from hone.data.passrates import CoolDown, Outcome, PassRates
from hone.data.schedulers import PromptScheduler, SchedulerContext, resolve_scheduler
from hone.types import Sample

_PERCENTILES = (10, 50, 90)


class Curriculum:
    def __init__(
        self, scheduler: PromptScheduler, rates: PassRates, cooldown: CoolDown | None, samples: list[Sample]
    ) -> None:
        self.scheduler, self.rates, self.cooldown = scheduler, rates, cooldown
        self._by_id = {s.id: s for s in samples}
        self._size = len(samples)
        self._drawn: dict[int, list[str]] = {}  # step -> sample ids: drawn, not yet observed

    def batch(self, step: int) -> list[Sample]:
        if step not in self._drawn:
            self._drawn[step] = [s.id for s in self.scheduler.next_batch(step)]
        return [self._by_id[i] for i in self._drawn[step]]

    def observe(self, step: int, outcomes: Mapping[str, Outcome]) -> dict[str, float]:
        """Fold step `step`'s results in; return the `prompts/*` metrics after them."""
        self._drawn.pop(step, None)
        self.rates.update(outcomes)
        if self.cooldown is not None:
            self.cooldown.update(step, self.rates, outcomes)
        self.scheduler.observe(step, outcomes)
        return self.metrics(step + 1)

    def pass_rates(self) -> list[float]:
        """The tracked pass rate of every prompt seen so far (the histogram's values)."""
        return list(self.rates.rates.values())

    def metrics(self, next_step: int) -> dict[str, float]:
        values = sorted(self.rates.rates.values())
        out = {"prompts/seen_frac": len(values) / self._size}
        if values:
            for q in _PERCENTILES:  # nearest-rank percentiles
                out[f"prompts/pass_rate_p{q}"] = values[min(len(values) - 1, len(values) * q // 100)]
        if self.cooldown is not None:
            cooling = sum(self.cooldown.skipped(i, next_step) for i in self.cooldown.until)
            out["prompts/skipped_frac"] = cooling / self._size
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "rates": self.rates.rates,
            "cooldown": None if self.cooldown is None else self.cooldown.until,
            "drawn": {str(step): ids for step, ids in self._drawn.items()},
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rates.rates = {k: float(v) for k, v in state["rates"].items()}
        if self.cooldown is not None:
            self.cooldown.until = {k: int(v) for k, v in (state["cooldown"] or {}).items()}
        self._drawn = {int(step): list(ids) for step, ids in state["drawn"].items()}
        self.scheduler.load_state_dict(state["scheduler"])


def build_curriculum(data: DataConfig, samples: list[Sample], seed: int) -> Curriculum:
    """The curriculum `data` asks for; a one-line `ValueError` naming the key when it cannot be built."""
    cls = resolve_scheduler(data.scheduler)
    rates = PassRates(data.pass_rate_ema)
    flt = data.difficulty_filter
    cooldown = None if flt is None else CoolDown(flt.lo, flt.hi, flt.cooldown_steps)
    ctx = SchedulerContext(list(samples), data.prompts_per_step, seed, rates, cooldown)
    try:
        scheduler = cls(ctx, **data.scheduler_args)
    except (TypeError, ValueError) as e:
        raise ValueError(f"data.scheduler_args: {data.scheduler} cannot be built: {e}") from e
    return Curriculum(scheduler, rates, cooldown, samples)

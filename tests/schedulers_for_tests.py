"""A user prompt scheduler that recipes in the tests name by dotted path (`data.scheduler`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hone.data.passrates import Outcome
from hone.data.schedulers import SchedulerContext
from hone.types import Sample


class LeastSeen:
    """The prompts drawn least often so far, ties by their order in the data."""

    def __init__(self, ctx: SchedulerContext, *, offset: int = 0) -> None:
        self.ctx = ctx
        self.counts = {s.id: 0 for s in ctx.samples}
        self.counts[ctx.samples[0].id] += offset
        self.observed: list[int] = []

    def next_batch(self, step: int) -> list[Sample]:
        batch = sorted(self.ctx.samples, key=lambda s: self.counts[s.id])[: self.ctx.batch_size]
        for s in batch:
            self.counts[s.id] += 1
        return batch

    def observe(self, step: int, outcomes: Mapping[str, Outcome]) -> None:
        self.observed.append(step)

    def state_dict(self) -> dict[str, Any]:
        return {"counts": self.counts, "observed": self.observed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.counts, self.observed = dict(state["counts"]), list(state["observed"])

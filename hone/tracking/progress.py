"""A training progress display: a live rich bar on a terminal, sparse plain lines otherwise.

Logs and CI capture stdout; a redrawn bar there is noise, so when the console is not a terminal the
same facts (step/total, reward, tokens/s, ETA) are printed as one line every `every` steps.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

REWARD_KEY = "reward/mean"
TOKENS_PER_S_KEY = "throughput/tokens_per_s"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


class Progress:
    """`update(step, metrics)` after each training step; reads `reward/mean` and `throughput/tokens_per_s`,
    and shows `updated`, the steps so far that updated the policy, when given.

    `initial` is the step a resumed run starts from; the ETA uses only the speed of this session.
    With `enabled=False` nothing is shown (e.g. `logging.progress: false` in a recipe).
    """

    def __init__(
        self,
        total: int,
        *,
        initial: int = 0,
        every: int = 10,
        description: str = "train",
        console: Console | None = None,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.total = total
        self.every = every
        self.description = description
        self.console = console or Console()
        self._start_step = initial
        self._start_time = time.monotonic()
        self._bar: RichProgress | None = None
        if enabled and self.console.is_terminal:
            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("reward {task.fields[reward]}"),
                TextColumn("{task.fields[tps]} tok/s"),
                TextColumn("updated {task.fields[updated]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._task = self._bar.add_task(
                description, total=total, completed=initial, reward="-", tps="-", updated="-"
            )
            self._bar.start()

    def eta_s(self, step: int) -> float | None:
        """Seconds left at the average speed since this session started, or None before any step."""
        done = step - self._start_step
        if done <= 0:
            return None
        return (time.monotonic() - self._start_time) / done * max(0, self.total - step)

    def update(
        self, step: int, metrics: Mapping[str, float] | None = None, *, updated: int | None = None
    ) -> None:
        metrics = metrics or {}
        reward = _fmt(metrics.get(REWARD_KEY), ".3f")
        tps = _fmt(metrics.get(TOKENS_PER_S_KEY), ".0f")
        updates = "-" if updated is None else f"{updated}/{step}"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, reward=reward, tps=tps, updated=updates)
        elif self.enabled and (step % self.every == 0 or step >= self.total):
            eta = self.eta_s(step)
            eta_text = "-" if eta is None else str(timedelta(seconds=round(eta)))
            self.console.print(
                f"{self.description} step {step}/{self.total} reward {reward} {tps} tok/s "
                f"updated {updates} ETA {eta_text}",
                highlight=False,
                markup=False,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

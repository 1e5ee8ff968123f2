"""A training progress display: a live rich bar on a terminal, sparse plain lines otherwise.

Logs and CI capture stdout; a redrawn bar there is noise, so when the console is not a terminal the
same facts (step/total, the family's own fields, ETA) are printed as one line after the first step (a real
model's first line should not wait ten steps) and then every `every` steps. Each family shows its own
fields (`fields`): a language model its reward, tokens/s and the steps that updated the policy
(`LANGUAGE_MODEL`), a control policy its training return and environment steps/s (`CONTROL`).

Under a time budget (`run.time_limit_s`) the run usually ends by time, not at `run.steps`: the total
shown is then the step the budget is expected to reach at the speed so far (`~3187 (time limit)`), and
the ETA the lesser of the time to finish the steps and the time left in the budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, TextColumn
from rich.progress import Progress as RichProgress

REWARD_KEY = "reward/mean"
TOKENS_PER_S_KEY = "throughput/tokens_per_s"


@dataclass(frozen=True)
class Shown:
    """One field of the progress line: `label` then the metric `key` formatted with `spec` (`-` when the
    step's metrics lack it); `suffix` after the value (`tok/s`)."""

    label: str
    key: str
    spec: str
    suffix: str = ""

    def text(self, metrics: Mapping[str, float]) -> str:
        value = _fmt(metrics.get(self.key), self.spec)
        return " ".join(part for part in (self.label, value, self.suffix) if part)


LANGUAGE_MODEL = (Shown("reward", REWARD_KEY, ".3f"), Shown("", TOKENS_PER_S_KEY, ".0f", "tok/s"))
CONTROL = (Shown("return", "episode/return", ".1f"), Shown("", "env/steps_per_s", ".0f", "env steps/s"))
OFFLINE = (Shown("eval return", "eval/return", ".1f"), Shown("updates", "offline/updates", ".0f"))
PREFERENCE = (Shown("loss", "loss", ".4f"),)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


class Progress:
    """`update(step, metrics)` after each training step; shows the `fields` of the step's metrics (a
    language model's by default), and `updated`, the steps so far that updated the policy, when given.

    `initial` is the step a resumed run starts from; the ETA uses only the speed of this session.
    With `enabled=False` nothing is shown (e.g. `logging.progress: false` in a recipe). `time_left_s` is
    what is left of the run's time budget as the first step starts (None: no budget); `clock` (seconds,
    monotonic) is for tests.
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
        time_left_s: float | None = None,
        clock: Callable[[], float] | None = None,
        fields: Sequence[Shown] = LANGUAGE_MODEL,
    ) -> None:
        self.enabled = enabled
        self.fields = tuple(fields)
        self.total = total
        self.every = every
        self.description = description
        self.console = console or Console()
        self._start_step = initial
        self._clock = clock or time.monotonic
        self._start_time = self._clock()
        self._deadline = None if time_left_s is None else self._start_time + time_left_s
        self._bar: RichProgress | None = None
        if enabled and self.console.is_terminal:
            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[steps]}"),
                TextColumn("{task.fields[shown]}"),
                TextColumn("{task.fields[updated]}"),
                TextColumn("ETA {task.fields[eta]}"),
                console=self.console,
            )
            self._task = self._bar.add_task(
                description,
                total=total,
                completed=initial,
                steps=f"{initial}/{total}",
                shown=self._shown({}),
                updated="",
                eta="-",
            )
            self._bar.start()

    def _estimate(self, step: int) -> tuple[int, str, float | None]:
        """(the step the run is expected to end at, that total as shown, the ETA in seconds or None)."""
        done = step - self._start_step
        if done <= 0:
            return self.total, str(self.total), None
        now = self._clock()
        per_step = max((now - self._start_time) / done, 1e-9)  # the average speed of this session
        eta = per_step * max(0, self.total - step)
        if self._deadline is None:
            return self.total, str(self.total), eta
        left = self._deadline - now
        if left <= 0:  # the loop ends after the step that crosses the deadline: this one
            ends = min(step, self.total)
            return ends, str(ends) if ends == self.total else f"{ends} (time limit)", 0.0
        ends = min(self.total, step + math.ceil(left / per_step))  # the step crossing the deadline still runs
        shown = str(ends) if ends == self.total else f"~{ends} (time limit)"
        return ends, shown, min(eta, left)

    def eta_s(self, step: int) -> float | None:
        """Seconds left at the average speed since this session started (at most what is left of the time
        budget), or None before any step."""
        return self._estimate(step)[2]

    def update(
        self, step: int, metrics: Mapping[str, float] | None = None, *, updated: int | None = None
    ) -> None:
        metrics = metrics or {}
        updates = "" if updated is None else f"updated {updated}/{step}"
        ends, total, eta = self._estimate(step)
        eta_text = "-" if eta is None else str(timedelta(seconds=round(eta)))
        if self._bar is not None:
            self._bar.update(
                self._task,
                total=ends,
                completed=step,
                steps=f"{step}/{total}",
                shown=self._shown(metrics),
                updated=updates,
                eta=eta_text,
            )
        elif self.enabled and (step == self._start_step + 1 or step % self.every == 0 or step >= ends):
            shown = " ".join(part for part in (self._shown(metrics), updates) if part)
            self.console.print(
                f"{self.description} step {step}/{total} {shown} ETA {eta_text}",
                highlight=False,
                markup=False,
            )

    def _shown(self, metrics: Mapping[str, float]) -> str:
        return " ".join(field.text(metrics) for field in self.fields)

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

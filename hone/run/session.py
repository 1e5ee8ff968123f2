"""One run's session, the same for every family (language-model RL, SFT/DPO/RM, control on- and off-policy,
offline, teams): what a training loop asks of the run around it.

    session = RunSession(cfg.run, resume=resume)          # seed and threads; the directory is chosen,
                                                          # nothing is written
    ... build the run; restore `session.latest` with `session.restore(parts)` ...
    with session.open_log(cfg, resume_step) as log, session.interrupts():
        for step in ...:
            session.check()                               # a signal that was swallowed ends the run here
            ...
            if session.due(step, cfg.run.eval_every, last=last): evaluate
            if session.due(step, cfg.run.save_every, last=last): session.checkpointer.save(step, parts)
            if session.out_of_time(): break               # run.time_limit_s
    session.plot(cfg.logging, family_default_keys)

The run directory is written only by `open_log`, once set-up has passed, so a start refused by bad input
leaves nothing behind and the same command, fixed, starts cleanly. A directory whose run saved no checkpoint
and did not finish is reused with a one-line note; one with a checkpoint or a finished run is refused (resume
it, or choose another `run.name`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from hone.run.lifecycle import (
    RunInterrupted,
    SetupError,
    advise_if_busy,
    deadline,
    open_run_dir,
    open_run_log,
    start_process,
    where_stopped,
)
from hone.signals import raise_if_signalled
from hone.tracking import METRICS_FILE, MetricsLogger, Progress, plot_metrics
from hone.tracking.progress import Shown
from hone.training.checkpoint import Part
from hone.training.distributed import ONE_RANK, Ranks
from hone.training.fit import FitSaves

if TYPE_CHECKING:
    from hone.config import HoneConfig, LoggingConfig, RunConfig

log = logging.getLogger("hone")

# torch's `load_state_dict` error for a tensor of another shape: the first one's name and both shapes.
_SIZE_MISMATCH = re.compile(
    r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from checkpoint, "
    r"the shape in current model is torch\.Size\((\[[^\]]*\])\)"
)
SUMMARY_FILE = "summary.json"  # written when a run ends; its presence marks the directory as a finished run


class RunSession:
    """The run's process settings, directory, checkpointer, clock and interrupts (see the module's
    docstring). `latest` is the checkpoint a resume starts from (None for a new run)."""

    def __init__(
        self,
        run: RunConfig,
        *,
        resume: bool,
        ranks: Ranks = ONE_RANK,
        threads: int | None = None,
        command: str = "train",
        shaped_by: str = "model.path, model.lora",
    ) -> None:
        self.run = run
        self.command = command  # the `hone` command that resumes the run (train, sft, dpo, rm)
        self.shaped_by = shaped_by  # the settings that shape the saved tensors, named when they do not fit
        self.started = start_process(run, threads=threads)
        self.dir, self.checkpointer, self.latest = open_run_dir(run, resume, ranks, command)
        self.deadline = deadline(run, self.started)

    def open_log(self, cfg: HoneConfig, resume_step: int | None = None) -> MetricsLogger:
        """metrics.jsonl (TensorBoard, W&B) and config.yaml: the first writes into the run directory, where
        the run has started (the advice for a busy machine is given here, not before a refusal)."""
        advise_if_busy()
        return open_run_log(cfg, self.dir, resume_step=resume_step)

    def restore(self, parts: dict[str, Part]) -> dict[str, Any]:
        """Load `latest` into `parts` and return its state.json; one line when it does not fit this run or
        is damaged."""
        state = self._load(parts)
        assert self.latest is not None
        log.info("resumed %s from %s", self.dir, self.latest.name)
        return state

    def _load(self, parts: dict[str, Part]) -> dict[str, Any]:
        assert self.latest is not None
        try:
            return self.checkpointer.load(self.latest, parts)
        except Exception as e:
            mismatch = _SIZE_MISMATCH.search(str(e))
            if mismatch is not None:  # torch's dump of every mismatched tensor says nothing of the cause
                name, saved, now = mismatch.groups()
                raise SetupError(
                    f"cannot resume from {self.latest}: its {name} is {saved}, this run's is {now}; a "
                    f"setting that shapes the model differs from the saved run's ({self.shaped_by}): "
                    "resume with the run's own, or start a new run"
                ) from None
            detail = " ".join(str(e).split())[:300]
            raise SetupError(f"cannot resume from {self.latest}: {type(e).__name__}: {detail}") from None

    def fit_saves(
        self,
        model: dict[str, Part],
        *,
        extra: dict[str, Any] | None = None,
        callbacks: Sequence[Callable[[int, Mapping[str, float]], object]] = (),
    ) -> FitSaves | None:
        """The offline loop's checkpoints (SFT, DPO, RM: `hone.training.fit`) in this run directory, every
        `run.save_every` steps, resuming from `latest` (whose `model` parts the caller restored first);
        `callbacks` (`run.callbacks`) after each step. None on N learner ranks, which save none yet."""
        if self.checkpointer.ranks.world > 1:
            return None

        def after(step: int, row: dict[str, float]) -> None:
            for callback in callbacks:
                callback(step, row)

        return FitSaves(
            save=self.checkpointer.save,
            model=model,
            every=self.run.save_every,
            extra=extra or {},
            restore=None if self.latest is None else self._load,
            after=after if callbacks else None,
        )

    def check(self) -> None:
        """At a step boundary: end the run if a signal arrived whose own interrupt was swallowed."""
        raise_if_signalled()

    def steps(self, steps: Iterable[int]) -> Iterator[int]:
        """`steps`, each after `check()`."""
        for step in steps:
            self.check()
            yield step

    def progress(
        self, logging_cfg: LoggingConfig, total: int, initial: int, description: str, fields: Sequence[Shown]
    ) -> Progress:
        """The progress display of a run of `total` steps from `initial`, in the family's own `fields`."""
        return Progress(
            total=total, initial=initial, enabled=logging_cfg.progress, description=description,
            time_left_s=self.time_left(), fields=fields,
        )  # fmt: skip

    @contextmanager
    def interrupts(self) -> Iterator[None]:
        """Ctrl-C or SIGTERM inside: one line saying where the run stopped and how to go on."""
        try:
            yield
        except KeyboardInterrupt:
            raise RunInterrupted(f"interrupted {where_stopped(self.dir, self.command)}") from None

    @staticmethod
    def due(step: int, every: int | None, *, last: bool = False) -> bool:
        """The cadence of evals and saves: at the run's last step, and every `every` steps (0: never)."""
        return last or bool(every and step % every == 0)

    def time_left(self) -> float | None:
        """Seconds left of `run.time_limit_s` (None: no budget)."""
        return None if self.deadline is None else self.deadline - time.perf_counter()

    def out_of_time(self) -> bool:
        """The budget is spent: the loop ends after the step that crossed it (saved and evaluated as the
        last one)."""
        left = self.time_left()
        return left is not None and left <= 0

    def say_out_of_time(self, step: int) -> None:
        log.info("time limit of %.0f s reached after step %d", self.run.time_limit_s, step)

    def end_step(
        self,
        step: int,
        metrics: dict[str, float],
        out: tuple[MetricsLogger, Progress, dict[str, Part]],
        evaluate: Callable[[], dict[str, float]],
        *,
        last: bool,
        stop: str = "",
    ) -> tuple[str, dict[str, float] | None]:
        """The end of a training step as every family ends it: evaluate when due (into the step's metrics),
        log them, show progress, checkpoint `out`'s parts when due. `last`: the run's last planned step;
        `stop`: a reason of the family's own to end here. Returns why the run ends after this step ("" to
        go on; "time limit" once `run.time_limit_s` is spent) and the eval, if one ran."""
        log_, progress, parts = out
        stopping = stop or ("time limit" if self.out_of_time() else "")
        last = last or bool(stopping)
        evaluated = evaluate() if self.due(step, self.run.eval_every, last=last) else None
        metrics |= evaluated or {}
        log_.log(step, metrics)
        progress.update(step, metrics)
        if self.due(step, self.run.save_every, last=last):
            self.checkpointer.save(step, parts)
        if stopping == "time limit":
            self.say_out_of_time(step)
        return stopping, evaluated

    def plot(self, logging_cfg: LoggingConfig, family_keys: Sequence[str]) -> None:
        """curves.png of `logging.plot`, or the family's own curves when the recipe names none."""
        keys = family_keys if logging_cfg.plot is None else logging_cfg.plot
        if keys:
            plot_metrics(self.dir / METRICS_FILE, self.dir / "curves.png", list(keys), title=self.run.name)

    def finish(self, summary: Mapping[str, Any]) -> None:
        """summary.json: the run's result in its family's own terms (and the mark of a finished run)."""
        (self.dir / SUMMARY_FILE).write_text(json.dumps(dict(summary), indent=2, default=str) + "\n")

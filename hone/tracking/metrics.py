"""Metrics sinks: `metrics.jsonl` (the source of truth), TensorBoard and, if asked, Weights & Biases.

The JSONL file is what plots, tests and run comparisons read, so it is flushed after every row and
made resume-safe: a run resumed from step N first drops the rows it is about to write again.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; lines that do not parse (a row cut off by a crash) are skipped."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def truncate_step_rows(path: Path, keep_up_to: int) -> None:
    """Keep only the rows of `path` (a step-keyed JSONL: metrics.jsonl, samples.jsonl) with step <=
    `keep_up_to`, rewritten atomically (a resumed run's rows after its checkpoint are dropped)."""
    kept = [row for row in read_metrics(path) if row["step"] <= keep_up_to]
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_value(value: Any) -> float | int | None:
    """Plain numbers for strict JSON: tensors/numpy scalars become floats, NaN/inf become null."""
    if isinstance(value, bool | int):
        return int(value)
    number = float(value)
    return number if math.isfinite(number) else None


class MetricsLogger:
    """Writes each `log(step, metrics)` to `run_dir/metrics.jsonl`, TensorBoard and W&B.

    `wandb` is the `wandb.init` keyword dict (e.g. `{"project": "hone", "mode": "offline"}`), or None for
    no W&B. A fresh run (`resume_step=None`) starts a new file; a resumed one keeps the rows up to
    `resume_step` and drops the later ones (atomically, before writing anything), and TensorBoard purges
    its events likewise, so no step ever appears twice.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        wandb: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        keep_up_to = -1 if resume_step is None else resume_step
        if self.path.exists():
            truncate_step_rows(self.path, keep_up_to)
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR), purge_step=keep_up_to + 1)
        self._wandb = None
        if wandb is not None:
            try:
                import wandb as wandb_lib
            except ImportError as err:
                raise ImportError(
                    "W&B logging is enabled but `wandb` is not installed: `pip install wandb` (the wandb "
                    "extra; use mode='offline' without network), or turn logging.wandb off."
                ) from err
            self._wandb = wandb_lib.init(dir=str(self.run_dir), **dict(wandb))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        values = {key: _json_value(value) for key, value in metrics.items() if key != "step"}
        self._file.write(json.dumps({"step": int(step), **values}) + "\n")
        self._file.flush()
        finite = {key: value for key, value in values.items() if value is not None}
        if self._tb is not None:
            for key, value in finite.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(finite, step=step)

    def histogram(self, step: int, key: str, values: Sequence[float]) -> None:
        """A distribution (TensorBoard and W&B only: metrics.jsonl holds scalars, e.g. its percentiles)."""
        if not values:
            return
        if self._tb is not None:
            import torch  # as TensorBoard's own import above: only when it is on

            self._tb.add_histogram(key, torch.tensor(values, dtype=torch.float64), step)
        if self._wandb is not None:
            import wandb as wandb_lib

            self._wandb.log({key: wandb_lib.Histogram(list(values))}, step=step)

    def text(self, step: int, key: str, text: str) -> None:
        """Markdown text (TensorBoard only: e.g. a step's samples, which samples.jsonl holds as records)."""
        if self._tb is not None:
            self._tb.add_text(key, text, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

"""`samples.jsonl`: what the model wrote, a few responses a step (`logging.samples`), beside the metrics.

One JSON object per line (a record: step, prompt, response, reward and its parts, advantage, finish
reason, ...), flushed after every step. Like metrics.jsonl it is resume-safe: a run resumed from step N
first drops the records of the steps after N, which it is about to write again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from hone.tracking.metrics import read_metrics, truncate_step_rows

SAMPLES_FILE = "samples.jsonl"


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """The records of a samples.jsonl; a line cut off by a crash is skipped."""
    return read_metrics(path)  # the same step-keyed JSONL


class SampleLog:
    """Appends each `write(records)` to `run_dir/samples.jsonl`; `resume_step`: keep only the records of
    steps up to it (atomically, before anything is written), as `MetricsLogger` does its rows."""

    def __init__(self, run_dir: str | Path, *, resume_step: int | None = None) -> None:
        self.path = Path(run_dir) / SAMPLES_FILE
        if self.path.exists():
            truncate_step_rows(self.path, -1 if resume_step is None else resume_step)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        self._file.writelines(json.dumps(dict(record)) + "\n" for record in records)
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SampleLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def samples_markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """The records as Markdown (TensorBoard's text plugin renders it): a heading with the numbers, then the
    prompt and the response as code blocks, so whitespace and special tokens show as they are."""
    out = []
    for k, r in enumerate(records):
        advantage = r.get("advantage")
        numbers = [
            f"reward {r['reward']:.4g}",
            *(f"{name} {value:.4g}" for name, value in r.get("reward_parts", {}).items()),
            "advantage -" if advantage is None else f"advantage {advantage:.4g}",
            f"finish {r['finish_reason']}",
        ]
        if r.get("reward_failed"):
            numbers.append("reward failed")
        out += [
            f"**sample {k}** ({r.get('sample_id', '')}): {', '.join(numbers)}",
            _code(r["prompt"]),
            _code(r["response"]),
        ]
    return "\n\n".join(out)


def _code(text: str) -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}\n{text}\n{fence}"

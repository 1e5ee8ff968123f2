"""Reading a run's metrics.jsonl in the benchmarks: its rows, and the RL wall clock at each step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rl_clock(rows: list[dict[str, Any]]) -> tuple[dict[int, float], float]:
    """Seconds of RL steps (`time/step_s`, so no eval or SFT time) done by each step, and in all."""
    clock, at_step = 0.0, {0: 0.0}
    for row in rows:
        if "time/step_s" in row:
            clock += row["time/step_s"]
            at_step[row["step"]] = clock
    return at_step, clock

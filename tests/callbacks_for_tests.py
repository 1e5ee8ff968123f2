"""A `run.callbacks` function the kill-and-resume tests name: the run kills itself at a chosen step."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path

KILL_STEP = 5  # after checkpoint 4 (`run.save_every: 4`), before checkpoint 8
MARKER = Path("killed-once")  # in the run's working directory: the resumed run must live


def sigkill_once_after_step_5(step: int, metrics: Mapping[str, float]) -> None:
    """SIGKILL this process once step 5 is logged, the first time only: a kill that lands between two
    checkpoints however loaded the machine is, where a test polling the metrics from outside raced the
    run (a step had to last long enough for the poll to catch it)."""
    if step == KILL_STEP and not MARKER.exists():
        MARKER.touch()
        os.kill(os.getpid(), signal.SIGKILL)

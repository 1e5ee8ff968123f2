"""Benchmark arms run side by side: each `hone` command in its own process group with its own log, all
waited for under one deadline, and every one stopped (SIGTERM, then SIGKILL) on success, failure, timeout
or Ctrl-C, so no arm outlives the benchmark."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path


def run_side_by_side(commands: dict[str, list[str]], logs: Path, timeout_s: float) -> None:
    """Start every command at once (`logs/<name>.log`); `SystemExit` naming the arm if one fails or the
    deadline passes."""
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with ExitStack() as files:
        try:
            for name, cmd in commands.items():
                log = files.enter_context(open(logs / f"{name}.log", "wb"))
                procs[name] = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            deadline = time.monotonic() + timeout_s
            for name, proc in procs.items():
                try:
                    code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise SystemExit(f"{name} still running after {timeout_s:.0f} s; stopped all") from None
                if code != 0:
                    raise SystemExit(f"{name} failed (exit {code}): {logs / name}.log")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in procs.values():
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)

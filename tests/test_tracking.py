"""Logging: JSONL rows and resume truncation, TensorBoard purge, W&B wiring, progress output, plots."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rich.console import Console

from hone.tracking import MetricsLogger, Progress, plot_metrics, read_metrics


def _steps(run_dir: Path) -> list[int]:
    return [row["step"] for row in read_metrics(run_dir / "metrics.jsonl")]


def test_rows_are_flushed_strict_json_with_step(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(
        1, {"loss/policy": torch.tensor(0.5), "reward/mean": np.float32(0.25), "n": 3, "kl": float("nan")}
    )
    # Readable before close: each row is flushed as it is written.
    line = (tmp_path / "metrics.jsonl").read_text()
    assert line.endswith("\n")
    assert json.loads(line) == {"step": 1, "loss/policy": 0.5, "reward/mean": 0.25, "n": 3, "kl": None}
    assert "NaN" not in line
    logger.close()


def test_resume_drops_later_rows_and_survives_a_torn_line(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(1, 6):
            logger.log(step, {"loss": float(step)})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "lo')  # killed mid-write
    with MetricsLogger(tmp_path, tensorboard=False, resume_step=3) as logger:
        assert _steps(tmp_path) == [1, 2, 3]
        logger.log(4, {"loss": 40.0})
        logger.log(5, {"loss": 50.0})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["loss"] == 50.0
    assert not list(tmp_path.glob("*.tmp"))


def test_a_fresh_run_starts_a_new_file(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 2, "a"')
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(0, {"a": 5})
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 0, "a": 5}]


def test_tensorboard_scalars_are_purged_on_resume(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path) as logger:
        for step in range(1, 5):
            logger.log(step, {"reward/mean": float(step), "kl": float("inf")})
    # TensorBoard reads event files in name order, "events.out.tfevents.<second>.<host>.<pid>.<n>": writers
    # of one process within one second sort by their counter n as text (10 before 9), which depends on how
    # many writers the test process made before. A real resume starts in a later second: so does this one.
    time.sleep(1.1)
    with MetricsLogger(tmp_path, resume_step=2) as logger:
        logger.log(3, {"reward/mean": 30.0})

    def reward_curve() -> list[tuple[int, float]]:
        events = EventAccumulator(str(tmp_path / "tensorboard"))
        events.Reload()
        assert "kl" not in events.Tags()["scalars"]  # non-finite values are not plotted
        return [(s.step, s.value) for s in events.Scalars("reward/mean")]

    assert reward_curve() == [(1, 1.0), (2, 2.0), (3, 30.0)]
    time.sleep(1.1)
    with MetricsLogger(tmp_path) as logger:  # a fresh run in the same directory replaces the curve
        logger.log(1, {"reward/mean": -1.0})
    assert reward_curve() == [(1, -1.0)]


def test_wandb_is_initialised_and_fed_when_enabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    class Run:
        def log(self, data: dict[str, float], step: int) -> None:
            calls.append(("log", (step, data)))

        def finish(self) -> None:
            calls.append(("finish", None))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls.append(("init", kwargs)) or Run()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with MetricsLogger(tmp_path, tensorboard=False, wandb={"project": "p", "mode": "offline"}) as logger:
        logger.log(7, {"reward/mean": 1.5, "kl": float("nan")})
    assert calls == [
        ("init", {"dir": str(tmp_path), "project": "p", "mode": "offline"}),
        ("log", (7, {"reward/mean": 1.5})),
        ("finish", None),
    ]


def test_wandb_enabled_but_missing_says_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
    with pytest.raises(ImportError, match=r"pip install wandb"):
        MetricsLogger(tmp_path, tensorboard=False, wandb={"project": "p"})
    MetricsLogger(tmp_path, tensorboard=False).close()  # disabled: no wandb needed


def test_progress_prints_sparse_plain_lines_when_not_a_tty() -> None:
    out = io.StringIO()
    with Progress(25, every=10, console=Console(file=out, force_terminal=False, width=200)) as progress:
        for step in range(1, 26):
            progress.update(step, {"reward/mean": 0.5, "throughput/tokens_per_s": 1234.4})
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["1/25", "10/25", "20/25", "25/25"]
    assert "reward 0.500" in lines[0] and "1234 tok/s" in lines[0] and "ETA 0:00:00" in lines[-1]


def test_disabled_progress_prints_nothing() -> None:
    for terminal in (False, True):
        out = io.StringIO()
        with Progress(
            3, every=1, enabled=False, console=Console(file=out, force_terminal=terminal)
        ) as progress:
            for step in range(1, 4):
                progress.update(step, {"reward/mean": 1.0})
        assert out.getvalue() == ""


def test_progress_eta_counts_only_this_session(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 110.0])
    monkeypatch.setattr("hone.tracking.progress.time.monotonic", lambda: next(clock))
    progress = Progress(100, initial=50, console=Console(file=io.StringIO(), force_terminal=False))
    assert progress.eta_s(60) == pytest.approx(40.0)  # 10 steps in 10 s, 40 to go


def test_progress_draws_a_live_bar_on_a_terminal() -> None:
    out = io.StringIO()
    with Progress(4, console=Console(file=out, force_terminal=True, width=120)) as progress:
        progress.update(3, {"reward/mean": 0.75})
    text = out.getvalue()
    assert "3/4" in text and "reward 0.750" in text and "\x1b[" in text


def test_plot_is_skipped_with_a_message_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Every matplotlib module, not just the package: a test before this one in the same worker may have
    # imported the submodules plot_metrics imports, and a cached submodule imports whatever its parent.
    for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    with caplog.at_level(logging.WARNING):
        assert plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "out.png", ["loss"]) is None
    assert "matplotlib is not installed" in caplog.text and not (tmp_path / "out.png").exists()


def test_plot_writes_a_png_when_matplotlib_is_available(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(1, 6):
            logger.log(step, {"loss": 1.0 / step, "reward/mean": step / 5})
    out = plot_metrics(
        tmp_path / "metrics.jsonl", tmp_path / "plots" / "curves.png", ["loss", "reward/mean", "x"]
    )
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_histograms_go_to_tensorboard_and_not_to_metrics_jsonl(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path) as logger:
        logger.log(1, {"prompts/pass_rate_p50": 0.5})
        logger.histogram(1, "prompts/pass_rate", [0.0, 0.5, 0.5, 1.0])
        logger.histogram(2, "prompts/pass_rate", [])  # nothing tracked yet: nothing written
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    (hist,) = events.Histograms("prompts/pass_rate")
    assert hist.step == 1 and hist.histogram_value.num == 4 and hist.histogram_value.sum == 2.0
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "prompts/pass_rate_p50": 0.5}]

"""The progress display under a time budget and its first line: driven by a fake clock, no sleeps."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from hone.tracking import Progress


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _plain(**kwargs: object) -> tuple[Progress, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    return Progress(console=console, **kwargs), out  # type: ignore[arg-type]


def _run(progress: Progress, clock: FakeClock, steps: range, step_s: float) -> None:
    for step in steps:
        clock.now += step_s
        progress.update(step, {"reward/mean": 0.5})


def test_total_and_eta_follow_the_time_budget_when_it_ends_the_run_first() -> None:
    clock = FakeClock()
    progress, out = _plain(total=5000, every=10, time_left_s=1000.0, clock=clock)
    _run(progress, clock, range(1, 11), step_s=2.0)  # 20 s for 10 steps: 980 s left, 490 more steps
    lines = out.getvalue().splitlines()
    assert lines[-1].split()[2] == "10/~500"
    assert "(time limit)" in lines[-1]
    assert progress.eta_s(10) == pytest.approx(980.0)  # the budget left, not 4990 steps x 2 s
    assert lines[-1].endswith("ETA 0:16:20")


def test_the_step_that_crosses_the_deadline_is_counted_and_shown_as_the_last() -> None:
    clock = FakeClock()
    progress, out = _plain(total=5000, every=10, time_left_s=9.0, clock=clock)
    _run(progress, clock, range(1, 5), step_s=2.0)  # the loop ends after step 5, which crosses 9 s
    assert out.getvalue().splitlines()[-1].split()[2] == "1/~5"  # only step 1 printed so far
    _run(progress, clock, range(5, 6), step_s=2.0)
    last = out.getvalue().splitlines()[-1]
    assert "step 5/5 (time limit)" in last and last.endswith("ETA 0:00:00")  # the last step: printed


def test_steps_that_end_before_the_budget_show_the_plain_total() -> None:
    clock = FakeClock()
    progress, out = _plain(total=100, every=10, time_left_s=1e6, clock=clock)
    _run(progress, clock, range(1, 11), step_s=1.0)
    last = out.getvalue().splitlines()[-1]
    assert last.split()[2] == "10/100" and "time limit" not in last and "~" not in last
    assert progress.eta_s(10) == pytest.approx(90.0)  # 90 steps x 1 s, well inside the budget


def test_without_a_budget_the_total_is_the_steps() -> None:
    clock = FakeClock()
    progress, out = _plain(total=5000, every=10, clock=clock)
    _run(progress, clock, range(1, 11), step_s=2.0)
    assert out.getvalue().splitlines()[-1].split()[2] == "10/5000"
    assert progress.eta_s(10) == pytest.approx(4990 * 2.0)


def test_the_first_line_comes_right_after_the_first_step_then_every_n() -> None:
    clock = FakeClock()
    progress, out = _plain(total=25, every=10, clock=clock)
    _run(progress, clock, range(1, 2), step_s=70.0)
    (first,) = out.getvalue().splitlines()  # after one 70 s step, not after ten
    assert first.split()[2] == "1/25" and first.endswith("ETA 0:28:00")  # 24 steps x 70 s
    _run(progress, clock, range(2, 26), step_s=70.0)
    assert [line.split()[2] for line in out.getvalue().splitlines()] == ["1/25", "10/25", "20/25", "25/25"]


def test_a_resumed_session_prints_its_own_first_step() -> None:
    clock = FakeClock()
    progress, out = _plain(total=100, every=10, initial=42, clock=clock)
    _run(progress, clock, range(43, 51), step_s=1.0)
    assert [line.split()[2] for line in out.getvalue().splitlines()] == ["43/100", "50/100"]


def test_the_terminal_bar_shows_the_estimated_total_and_eta() -> None:
    clock = FakeClock()
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    with Progress(5000, console=console, time_left_s=1000.0, clock=clock) as progress:
        _run(progress, clock, range(1, 11), step_s=2.0)
    text = out.getvalue()
    assert "10/~500 (time limit)" in text and "ETA 0:16:20" in text


def test_each_family_shows_its_own_fields() -> None:
    from hone.tracking.progress import CONTROL, PREFERENCE

    control, out = _plain(total=10, fields=CONTROL)
    control.update(1, {"episode/return": 21.5, "env/steps_per_s": 4800.0, "reward/mean": 0.5})
    line = out.getvalue()
    assert "return 21.5" in line and "4800 env steps/s" in line
    assert "tok/s" not in line and "reward" not in line and "updated" not in line
    dpo, out = _plain(total=10, fields=PREFERENCE)
    dpo.update(1, {"loss": 0.6931})
    assert "loss 0.6931" in out.getvalue() and "tok/s" not in out.getvalue()

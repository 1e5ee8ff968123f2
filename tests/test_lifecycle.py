"""Process set-up: the advice for a machine busier than its cores (OpenMP's spinning threads)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from hone.cli import main
from hone.config import load_config
from hone.run.lifecycle import busy_machine_advice
from hone.run.session import RunSession


def test_busy_machine_advice_only_when_oversubscribed_and_openmp_still_spins() -> None:
    advice = busy_machine_advice(7.0, 2, {})
    assert advice is not None and "OMP_WAIT_POLICY=PASSIVE" in advice and "load 7.0 on 2 cores" in advice
    assert busy_machine_advice(1.9, 2, {}) is None  # an idle or fully used machine: spinning pays
    assert busy_machine_advice(7.0, 2, {"OMP_WAIT_POLICY": "ACTIVE"}) is None  # the user chose
    assert busy_machine_advice(7.0, 2, {"GOMP_SPINCOUNT": "1000"}) is None


@pytest.mark.integration
def test_a_refusal_on_a_busy_machine_is_one_line_and_the_advice_waits_for_a_start(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 51: the advice came before a refusal (an existing run directory), making two lines."""
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    finished = tmp_path / "done"
    finished.mkdir()
    (finished / "metrics.jsonl").write_text('{"step": 1}\n')
    (finished / "summary.json").write_text("{}")
    assert main(["train", f"run.dir={tmp_path}", "run.name=done"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "OMP_WAIT_POLICY" not in err
    session = RunSession(load_config(None, [f"run.dir={tmp_path}", "run.name=new"]).run, resume=False)
    with caplog.at_level(logging.WARNING, logger="hone"):
        assert not any("OMP_WAIT_POLICY" in r.getMessage() for r in caplog.records)
        session.open_log(load_config(None, [f"run.dir={tmp_path}", "run.name=new"])).close()
    assert any("OMP_WAIT_POLICY=PASSIVE" in r.getMessage() for r in caplog.records)

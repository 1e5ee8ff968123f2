"""Process set-up: the advice for a machine busier than its cores (OpenMP's spinning threads)."""

from __future__ import annotations

from hone.run.lifecycle import busy_machine_advice


def test_busy_machine_advice_only_when_oversubscribed_and_openmp_still_spins() -> None:
    advice = busy_machine_advice(7.0, 2, {})
    assert advice is not None and "OMP_WAIT_POLICY=PASSIVE" in advice and "load 7.0 on 2 cores" in advice
    assert busy_machine_advice(1.9, 2, {}) is None  # an idle or fully used machine: spinning pays
    assert busy_machine_advice(7.0, 2, {"OMP_WAIT_POLICY": "ACTIVE"}) is None  # the user chose
    assert busy_machine_advice(7.0, 2, {"GOMP_SPINCOUNT": "1000"}) is None

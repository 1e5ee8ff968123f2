"""curves.png: the default metric set, panels only for what the run wrote, warnings with suggestions."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from hone.config import LoggingConfig, load_config
from hone.rl.loop import train
from hone.tracking import read_metrics
from hone.tracking.plot import DEFAULT_PLOT_METRICS, plot_metrics
from tests.helpers import tiny_overrides

pytest.importorskip("matplotlib")


def _metrics(path: Path, steps: int = 30, eval_every: int = 10, **extra: float) -> Path:
    rows: list[dict[str, Any]] = [{"step": 0, "eval/accuracy": 0.1}]
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "reward/mean": step / steps,
            "entropy": 2.0 - step / steps,
            "response_length/mean": 100.0 + step,
            "groups/skipped_frac": 0.25,
            **extra,
        }
        if step % eval_every == 0:
            row["eval/accuracy"] = step / (2 * steps)
        rows.append(row)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures `plot_metrics` saves, kept for inspection (the PNG is still written)."""
    from matplotlib.figure import Figure

    saved: list[Any] = []
    save = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> None:
        saved.append(self)
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def _panels(figure: Any) -> list[str]:
    return [axes.get_title() for axes in figure.axes]


def test_logging_plot_defaults_to_the_default_set_and_an_empty_list_turns_it_off() -> None:
    assert LoggingConfig().plot is None  # each family's own curves; a language model's are these
    assert "null = the family's own" in (LoggingConfig.model_fields["plot"].description or "")
    assert {"reward/mean", "eval/accuracy", "entropy", "kl"} <= set(DEFAULT_PLOT_METRICS)
    assert "[]" in (LoggingConfig.model_fields["plot"].description or "")  # says how to turn it off
    assert load_config(None, ["logging.plot=[]"]).logging.plot == []


def test_the_default_set_draws_what_the_run_wrote_and_skips_the_rest_quietly(
    tmp_path: Path, figures: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    metrics = _metrics(tmp_path / "metrics.jsonl")  # no kl: a run with kl.coef 0
    with caplog.at_level(logging.WARNING):
        out = plot_metrics(metrics, tmp_path / "curves.png", DEFAULT_PLOT_METRICS, title="my-run")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert caplog.records == []
    (figure,) = figures
    assert figure.get_suptitle() == "my-run"
    assert _panels(figure) == [key for key in DEFAULT_PLOT_METRICS if key != "kl"]
    assert figure.axes[0].get_gridspec().ncols == 2  # two columns, not one tall strip
    first = figure.axes[0]
    assert all(first.get_shared_x_axes().joined(first, axes) for axes in figure.axes)
    (evals,) = figure.axes[1].lines  # eval/accuracy: points only, no line between evals
    assert evals.get_linestyle() == "None" and evals.get_marker() == "o"
    assert len(evals.get_xdata()) == 4  # steps 0, 10, 20, 30
    assert figure.axes[0].lines[0].get_linestyle() == "-"  # a per-step metric is a line
    # An odd count: the lone panel of the last line and the one above the empty cell both show steps.
    assert [axes.get_xlabel() for axes in figure.axes[-2:]] == ["step", "step"]


def test_a_name_not_in_the_metrics_warns_once_with_close_matches_and_gets_no_panel(
    tmp_path: Path, figures: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    metrics = _metrics(tmp_path / "metrics.jsonl")
    keys = ["reward/mena", "reward/mean", "kl", "entropy"]
    with caplog.at_level(logging.WARNING):
        assert plot_metrics(metrics, tmp_path / "curves.png", keys, title="r") is not None
    (record,) = caplog.records  # one line for all of them
    assert "'reward/mena' (did you mean 'reward/mean'" in record.getMessage()
    assert "'kl'" in record.getMessage()  # a name the user asked for is warned about, even a real metric
    (figure,) = figures
    assert _panels(figure) == ["reward/mean", "entropy"]  # no empty "no data" panels


def test_a_metric_with_only_non_finite_values_is_named_as_such(
    tmp_path: Path, figures: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "kl": null, "entropy": 1.0}\n{"step": 2, "kl": null, "entropy": 0.9}\n')
    with caplog.at_level(logging.WARNING):
        plot_metrics(metrics, tmp_path / "curves.png", ["kl", "entropy"])
    assert "'kl' (no finite value)" in caplog.text
    assert _panels(figures[0]) == ["entropy"]


def test_nothing_to_draw_writes_no_png(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    metrics = _metrics(tmp_path / "metrics.jsonl")
    with caplog.at_level(logging.WARNING):
        assert plot_metrics(metrics, tmp_path / "curves.png", ["loss/policy"]) is None
    assert not (tmp_path / "curves.png").exists() and len(caplog.records) == 1


def test_a_tiny_run_draws_every_default_curve_without_configuring_anything(
    tmp_path: Path, micro_model_dir: Path, figures: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    overrides = {
        "run.steps": 3,
        "run.save_every": 3,
        "run.eval_every": 2,
        "algorithm.kl.coef": 0.01,
        "algorithm.skip_zero_variance_groups": "true",
        "reward.fn": "tests.rewards_for_tests:token_id_reward",
    }
    args = tiny_overrides(tmp_path, micro_model_dir, "curvy", **overrides)
    args = [a for a in args if not a.startswith("logging.plot=")]
    with caplog.at_level(logging.WARNING, logger="hone.tracking.plot"):
        train(load_config(None, args))  # logging.plot left at its default
    run = tmp_path / "curvy"
    logged = {key for row in read_metrics(run / "metrics.jsonl") for key in row}
    assert set(DEFAULT_PLOT_METRICS) <= logged, set(DEFAULT_PLOT_METRICS) - logged  # the loop's names
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (figure,) = figures
    assert _panels(figure) == list(DEFAULT_PLOT_METRICS) and figure.get_suptitle() == "curvy"
    assert not [r for r in caplog.records if r.name == "hone.tracking.plot"]

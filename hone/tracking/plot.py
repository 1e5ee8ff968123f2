"""Curves of a run's metrics as a PNG, for READMEs and quick looks without TensorBoard.

matplotlib is deliberately not a dependency of Hone: without it this is a no-op with a message.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hone.tracking.metrics import read_metrics

log = logging.getLogger(__name__)

SMOOTH_WINDOW = 10
COLUMNS = 2
# What `logging.plot` draws unless a recipe says otherwise: the curves to look at first. A run may never
# write some of them (`kl` with `algorithm.kl.coef: 0`, `eval/accuracy` without an eval set): those panels
# are left out without a word, where a name the recipe lists itself is warned about.
DEFAULT_PLOT_METRICS: tuple[str, ...] = (
    "reward/mean",
    "eval/accuracy",
    "entropy",
    "response_length/mean",
    "groups/skipped_frac",
    "kl",
)


def plot_metrics(
    metrics_jsonl: str | Path, out_png: str | Path, keys: Sequence[str], *, title: str | None = None
) -> Path | None:
    """Plot each of `keys` against `step`, one panel each in `COLUMNS` columns sharing the step axis, under
    `title` (the run's name); return the PNG path, or None if nothing was drawn.

    A key with no value in the file gets no panel: one warning names such keys with the file's close
    matches, unless `keys` is `DEFAULT_PLOT_METRICS`. Evals (`eval/*`) and other metrics logged on fewer
    than half the rows are drawn as points, not a line.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        log.warning(
            "matplotlib is not installed; skipping %s (pip install matplotlib, or logging.plot=[])",
            out_png,
        )
        return None
    if not keys:
        raise ValueError("plot_metrics needs at least one metric key")
    keys = list(dict.fromkeys(keys))
    rows = read_metrics(metrics_jsonl)
    series = {key: [(row["step"], row[key]) for row in rows if row.get(key) is not None] for key in keys}
    drawn = [key for key in keys if series[key]]
    missing = [key for key in keys if not series[key]]
    default = keys == list(DEFAULT_PLOT_METRICS)
    if missing and not default:
        logged = {name for row in rows for name, value in row.items() if value is not None} - {"step"}
        log.warning(
            "plot %s: skipped, not in %s: %s",
            Path(out_png).name,
            metrics_jsonl,
            ", ".join(_why_missing(key, logged, rows) for key in missing),
        )
    if not drawn:
        if default:  # a name given is warned about above
            log.warning("plot %s: none of %s has a value in %s; nothing drawn", out_png, keys, metrics_jsonl)
        return None
    columns = min(COLUMNS, len(drawn))
    lines = math.ceil(len(drawn) / columns)
    # Figure + Agg canvas directly: no pyplot global state, no GUI backend. Fixed margins (in inches), not
    # constrained layout: that takes most of a second, at the end of every run (and of every test's run).
    width, height = 5.5 * columns, 2.4 * lines + (0.9 if title else 0.6)
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    figure.subplots_adjust(
        left=0.8 / width,
        right=1 - 0.2 / width,
        bottom=0.5 / height,
        top=1 - (0.7 if title else 0.35) / height,
        wspace=0.25,
        hspace=0.4,
    )
    grid = figure.subplots(lines, columns, squeeze=False, sharex=True)
    for k, key in enumerate(drawn):
        _draw(grid[k // columns, k % columns], key, series[key], sparse=_sparse(key, series[key], rows))
    for k in range(len(drawn), lines * columns):  # an odd count: the last line has an empty cell
        grid[k // columns, k % columns].remove()
    for column in range(columns):  # each column's lowest panel carries the step axis
        bottom = grid[_lowest(len(drawn), columns, column), column]
        bottom.xaxis.set_tick_params(labelbottom=True)
        bottom.set_xlabel("step")
    if title:
        figure.suptitle(title)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, dpi=120)
    return out_png


def _lowest(count: int, columns: int, column: int) -> int:
    """The line of the last panel in `column` when `count` panels fill `columns` columns line by line."""
    return (count - 1 - column) // columns


def _sparse(key: str, points: list[tuple[int, float]], rows: list[dict[str, Any]]) -> bool:
    return key.startswith("eval/") or 2 * len(points) < len(rows)


def _draw(axes: Any, key: str, points: list[tuple[int, float]], *, sparse: bool) -> None:
    steps, values = zip(*points, strict=True)
    if sparse:  # evals every N steps: each point is a measurement, a line between them would invent data
        axes.plot(steps, values, linestyle="none", marker="o")
    elif len(points) >= 2 * SMOOTH_WINDOW:  # per-step metrics are noisy: draw a moving mean over them
        axes.plot(steps, values, alpha=0.3, linewidth=0.8)
        means = [
            sum(values[max(0, i - SMOOTH_WINDOW + 1) : i + 1]) / min(i + 1, SMOOTH_WINDOW)
            for i in range(len(values))
        ]
        axes.plot(steps, means, label=f"mean of last {SMOOTH_WINDOW}")
        axes.legend(loc="best", fontsize="small")
    else:  # a few steps: points matter
        axes.plot(steps, values, marker="o")
    axes.set_title(key, fontsize="medium")
    axes.grid(alpha=0.3)


def _why_missing(key: str, logged: set[str], rows: list[dict[str, Any]]) -> str:
    if any(key in row for row in rows):
        return f"{key!r} (no finite value)"
    close = difflib.get_close_matches(key, sorted(logged), n=3)
    return f"{key!r} (did you mean {' or '.join(map(repr, close))}?)" if close else repr(key)

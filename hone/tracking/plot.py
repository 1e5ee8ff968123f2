"""Curves of a run's metrics as a PNG, for READMEs and quick looks without TensorBoard.

matplotlib is deliberately not a dependency of Hone: without it this is a no-op with a message.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hone.tracking.metrics import read_metrics

log = logging.getLogger(__name__)

SMOOTH_WINDOW = 10


def plot_metrics(metrics_jsonl: str | Path, out_png: str | Path, keys: Sequence[str]) -> Path | None:
    """Plot each of `keys` against `step` (one panel per key); return the PNG path, or None if skipped."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        log.warning("matplotlib is not installed; skipping plot %s (pip install matplotlib)", out_png)
        return None
    if not keys:
        raise ValueError("plot_metrics needs at least one metric key")
    rows = read_metrics(metrics_jsonl)
    # Figure + Agg canvas directly: no pyplot global state, no GUI backend.
    figure = Figure(figsize=(6, 2.6 * len(keys)), layout="constrained")
    FigureCanvasAgg(figure)
    for axes, key in zip(figure.subplots(len(keys), 1, squeeze=False)[:, 0], keys, strict=True):
        points = [(row["step"], row[key]) for row in rows if row.get(key) is not None]
        if points:
            steps, values = zip(*points, strict=True)
            if len(points) >= 2 * SMOOTH_WINDOW:  # per-step metrics are noisy: draw a moving mean over them
                axes.plot(steps, values, alpha=0.3, linewidth=0.8)
                means = [
                    sum(values[max(0, i - SMOOTH_WINDOW + 1) : i + 1]) / min(i + 1, SMOOTH_WINDOW)
                    for i in range(len(values))
                ]
                axes.plot(steps, means, label=f"mean of last {SMOOTH_WINDOW}")
                axes.legend(loc="best", fontsize="small")
            else:  # sparse (eval every N steps): points matter
                axes.plot(steps, values, marker="o")
        else:
            axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
        axes.set_ylabel(key)
        axes.grid(alpha=0.3)
    figure.axes[-1].set_xlabel("step")
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, dpi=120)
    return out_png

"""Run observability: metrics.jsonl + TensorBoard + optional W&B, a progress display, and plots."""

from hone.tracking.metrics import METRICS_FILE, MetricsLogger, read_metrics
from hone.tracking.plot import plot_metrics
from hone.tracking.progress import Progress

__all__ = ["METRICS_FILE", "MetricsLogger", "Progress", "plot_metrics", "read_metrics"]

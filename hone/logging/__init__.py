"""Run observability: metrics.jsonl + TensorBoard + optional W&B, a progress display, and plots."""

from hone.logging.metrics import METRICS_FILE, MetricsLogger, read_metrics
from hone.logging.plot import plot_metrics
from hone.logging.progress import Progress

__all__ = ["METRICS_FILE", "MetricsLogger", "Progress", "plot_metrics", "read_metrics"]

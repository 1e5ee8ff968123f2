"""Run observability: metrics.jsonl + TensorBoard + optional W&B, samples.jsonl, progress, and plots."""

from hone.tracking.metrics import METRICS_FILE, MetricsLogger, read_metrics
from hone.tracking.plot import plot_metrics
from hone.tracking.progress import Progress
from hone.tracking.samples import SAMPLES_FILE, SampleLog, read_samples, samples_markdown

__all__ = [
    "METRICS_FILE",
    "SAMPLES_FILE",
    "MetricsLogger",
    "Progress",
    "SampleLog",
    "plot_metrics",
    "read_metrics",
    "read_samples",
    "samples_markdown",
]

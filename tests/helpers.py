"""Helpers shared by the tests (each says what it stands in for)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hone.config import HoneConfig
from hone.data import Task
from hone.data.splits import load_data, validation_samples
from hone.types import Sample


def run_splits(
    cfg: HoneConfig, make_env: Callable[[], Any] | None = None
) -> tuple[Task | None, list[Sample], list[Sample]]:
    """`load_data` with the values a run passes it from its config (as `build_components` does)."""
    return load_data(
        cfg.data, eval_size=cfg.eval.size, seed=cfg.run.seed, make_env=make_env, env_args=cfg.env.args
    )


def run_validation(
    cfg: HoneConfig,
    task: Task | None,
    make_env: Callable[[], Any] | None,
    train: list[Sample],
    eval_set: list[Sample],
) -> list[Sample]:
    """`validation_samples` with the values a run's SFT warm start passes it from its config."""
    return validation_samples(
        cfg.data, task, train, eval_set, val_size=cfg.sft.val_size, make_env=make_env, env_args=cfg.env.args
    )

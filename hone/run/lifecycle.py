"""A run's life around its training, the same for every command (train, sft, dpo, rm): the run directory
(refused when it already holds a run), the process's threads and seed, `config.yaml` written atomically once
set-up has passed, the metrics log, the wall-clock deadline, and the one-line errors of set-up and of an
interrupted run.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from hone.config import RUN_CONFIG_HEADER, HoneConfig, RunConfig
from hone.errors import HoneError
from hone.tracking import METRICS_FILE, MetricsLogger, read_metrics
from hone.training.checkpoint import Checkpointer
from hone.training.distributed import Ranks
from hone.version import version_line

log = logging.getLogger("hone")


class SetupError(HoneError, RuntimeError):
    """Bad input found while building a run (before any training): one line, naming the thing."""


class RunInterrupted(Exception):
    """Ctrl-C (or SIGTERM, see `hone.cli`) during a run; the message is one line: where it stopped, the
    last checkpoint, and how to resume."""


def start_process(run: RunConfig, threads: int | None = None) -> float:
    """The process's torch threads (`threads`, else `run.threads`) and global seed; returns the run's start
    time. The advice for a busy machine waits for the run to start (`advise_if_busy`): a recipe refused
    before then stays one line."""
    threads = threads or run.threads
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(run.seed)
    return time.perf_counter()


def advise_if_busy() -> None:
    """Log `busy_machine_advice` once, as a run starts writing (or a server starts serving)."""
    advice = busy_machine_advice(os.getloadavg()[0], os.cpu_count() or 1, os.environ)
    if advice:
        log.warning(advice)


def busy_machine_advice(load: float, cores: int, env: Mapping[str, str]) -> str | None:
    """One line of advice when more threads want the CPU than it has and OpenMP still spins.

    OpenMP's worker threads spin between parallel regions by default; with other processes on the cores
    they spin on time slices the work needs. Measured (2 cores, a tiny model's forward and backward with
    5 busy processes beside it): 2.53 s a step by default against 0.64 s with `OMP_WAIT_POLICY=PASSIVE`,
    which on an idle machine costs 15-20% (0.15 vs 0.13 s), so it is advice rather than a default. It
    must be set before torch loads OpenMP, i.e. in the environment that starts Hone.
    """
    if load <= cores or "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return None
    return (
        f"the machine is busy (load {load:.1f} on {cores} cores) and OpenMP threads spin while they wait: "
        "start Hone with OMP_WAIT_POLICY=PASSIVE in the environment (4x faster steps measured at load 7 on "
        "2 cores; 15-20% slower on an idle machine)"
    )


def deadline(run: RunConfig, started: float) -> float | None:
    """When the run's wall-clock budget (`run.time_limit_s`) ends, if it has one."""
    return None if run.time_limit_s is None else started + run.time_limit_s


def new_run_dir(run: RunConfig, *, resumable: bool = True, command: str = "train") -> Path:
    """`runs/<name>` for a new run (nothing is written here). A directory that holds a run is refused when
    that run saved a checkpoint or finished; one whose run stopped before either (a start that failed, an
    interrupt before the first checkpoint) is reused, with a note: there is nothing in it to go on from.
    `command`: the `hone` command that resumes it (train, sft, dpo, rm)."""
    run_dir = Path(run.dir) / run.name
    if not (run_dir / METRICS_FILE).exists():
        return run_dir
    # summary.json marks every finished run; a final `model/` (control, DPO, RM) one from before it existed
    finished = any((run_dir / name).exists() for name in ("summary.json", "model"))
    if finished or Checkpointer(run_dir).latest() is not None:
        resumable = resumable and not finished
        resume = f"resume it with `hone {command} --resume {run_dir}` or " if resumable else ""
        raise SetupError(f"{run_dir} already holds a run; {resume}choose another run.name")
    log.info("%s holds a run that stopped before its first checkpoint: starting it again there", run_dir)
    return run_dir


def open_run_dir(
    run: RunConfig, resume: bool, ranks: Ranks | None = None, command: str = "train"
) -> tuple[Path, Checkpointer, Path | None]:
    """The run directory, its checkpointer and, resuming, the newest intact checkpoint (one line when
    there is none to resume from). Nothing is written here: a start that fails in set-up leaves an
    existing run as it was."""
    run_dir = Path(run.dir) / run.name if resume else new_run_dir(run, command=command)
    checkpointer = Checkpointer(run_dir, keep_last=run.keep_last, ranks=ranks)
    if not resume:
        return run_dir, checkpointer, None
    try:
        latest = checkpointer.latest_intact()
    except ValueError as e:
        raise SetupError(f"cannot resume {run_dir}: {e}") from None
    if latest is None:
        raise SetupError(
            f"cannot resume {run_dir}: no checkpoint in {run_dir / 'checkpoints'} (run.save_every); start it "
            "again without --resume (the directory is reused)"
        )
    return run_dir, checkpointer, latest


def write_run_config(run_dir: Path, cfg: HoneConfig) -> None:
    """Write `config.yaml` (what `--resume` reads) atomically: a crash mid-write keeps the old one."""
    tmp = run_dir / ".config.yaml.tmp"
    with tmp.open("w") as f:
        f.write(f"{RUN_CONFIG_HEADER} · {version_line()}\n")
        f.write(cfg.to_yaml())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / "config.yaml")


def where_stopped(run_dir: Path, command: str = "train") -> str:
    """'at step N; last checkpoint step M; resume with `hone <command> --resume …`' (with no checkpoint:
    how to start again), read from the run directory's files."""
    rows = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).exists() else []
    done = max((int(row["step"]) for row in rows), default=0)  # the last step that finished and logged
    latest = Checkpointer(run_dir).latest()
    at = f"at step {done}" if done else "before the first step"
    if latest is None:
        return f"{at}; no checkpoint yet; the same command starts it again"
    saved = latest.name.replace("-", " ")
    return f"{at}; last checkpoint {saved}; resume with `hone {command} --resume {run_dir}`"


def open_run_log(cfg: HoneConfig, run_dir: Path, *, resume_step: int | None = None) -> MetricsLogger:
    """Open metrics.jsonl/TensorBoard/W&B (a resumed run's rows after `resume_step` go), then write
    `config.yaml`: only now, once set-up has passed, so a start that failed changed nothing. Opened before
    any training, so a missing W&B install fails at once, not after minutes of work."""
    created = not run_dir.exists()
    wandb = {
        "project": cfg.logging.wandb_project,
        "name": cfg.run.name,
        "id": cfg.run.name,
        "resume": "allow",
    }
    try:
        metrics_log = MetricsLogger(
            run_dir,
            tensorboard=cfg.logging.tensorboard,
            wandb=wandb if cfg.logging.wandb else None,
            resume_step=resume_step,
        )
    except ImportError as e:
        if created:  # a failed start leaves no empty run directory behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise SetupError(str(e)) from e
    write_run_config(run_dir, cfg)
    return metrics_log

"""`hone train ... trainer.world_size=N`: start N learner-rank processes of the same command, as torchrun
would, and end them together.

Each rank is `python -m hone.cli <the same arguments>` with torchrun's environment (`RANK`, `LOCAL_RANK`,
`WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), in a session of its own so that what a
rank starts (a vLLM engine, an environment server) ends with it, and set to die with the launcher
(`PR_SET_PDEATHSIG`) should the launcher itself be killed. A rank's one-line error goes to a file
(`HONE_ERROR_FILE`, like torchrun's `TORCHELASTIC_ERROR_FILE`), not its stderr, so the launcher prints
exactly one line for the run:

- a rank exits non-zero: every other rank is stopped (SIGTERM, then SIGKILL after `GRACE_S`), and the
  line is that rank's error (or how it died), the step reached and the last checkpoint;
- Ctrl-C or SIGTERM on the launcher: every rank gets SIGTERM (rank 0 writes where it stopped and how to
  resume), and any still running after `GRACE_S` is killed: all are gone within 10 s.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hone.config import ConfigError, HoneConfig

GRACE_S = 6.0  # a rank's time to end on SIGTERM before it is killed
POLL_S = 0.1
ERROR_FILE = "HONE_ERROR_FILE"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child before exec (Linux): SIGKILL when the launcher dies
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


@dataclass
class Rank:
    rank: int
    process: subprocess.Popen[bytes]
    error_file: Path

    def error(self) -> str | None:
        """The rank's one-line error, if it wrote one."""
        with contextlib.suppress(OSError):
            text = self.error_file.read_text().strip()
            return text or None
        return None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


def rank_environment(rank: int, world: int, port: int, error_file: Path, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **{ERROR_FILE: str(error_file)},
    )
    env.setdefault("OMP_NUM_THREADS", str(threads))  # N ranks share the cores, as torchrun sets it
    return env


def launch(argv: Sequence[str], world: int) -> tuple[int, str | None]:
    """Run `hone <argv>` as `world` rank processes on this machine. Returns the run's exit status (0, 2
    when a rank failed, or 128 + the signal that stopped it) and the one line to print, if any."""
    threads = max(1, (os.cpu_count() or 1) // world)
    port = free_port()
    received: dict[str, int] = {}

    def stop(signum: int, _frame: object) -> None:
        received.setdefault("signal", signum)

    with tempfile.TemporaryDirectory(prefix="hone-ranks-") as tmp, _handling(stop):
        ranks = []
        try:
            for rank in range(world):
                error_file = Path(tmp) / f"rank-{rank}.err"
                process = subprocess.Popen(
                    [sys.executable, "-m", "hone.cli", *argv],
                    env=rank_environment(rank, world, port, error_file, threads),
                    start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
                ranks.append(Rank(rank, process, error_file))
            failed = _watch(ranks, received)
            ended = _settle(ranks) if failed is not None else {}
        finally:
            _stop_all(ranks)
        if "signal" in received:
            return 128 + received["signal"], ranks[0].error() or "interrupted"
        if failed is None:
            return 0, None
        failed = _first_cause(ranks, ended, failed)
        error = failed.error()
        if failed.rank == 0 and error is not None:  # rank 0's own error line: bad input, a run that stopped
            return 2, error
        return 2, f"learner rank {failed.rank} of {world}: {error or _death(failed.process.returncode)}"


def _death(code: int) -> str:
    if code < 0:
        return f"died of {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _watch(ranks: list[Rank], received: dict[str, int]) -> Rank | None:
    """Until every rank has exited 0 (None), one has failed (it), or the launcher got a signal."""
    while "signal" not in received:
        running = False
        for r in ranks:
            code = r.process.poll()
            if code is None:
                running = True
            elif code != 0:
                return r
        if not running:
            return None
        time.sleep(POLL_S)
    return None


def _settle(ranks: list[Rank], within_s: float = 1.0) -> dict[int, int]:
    """The exit status of each rank that has ended on its own, after `within_s` for a failure to spread
    (a rank that raised; the others' collectives break within milliseconds of its exit)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(r.process.poll() is None for r in ranks):
        time.sleep(POLL_S)
    return {r.rank: code for r in ranks if (code := r.process.poll()) is not None}


def _first_cause(ranks: list[Rank], ended: dict[int, int], seen: Rank) -> Rank:
    """The rank whose failure ended the run: one killed by a signal, else one whose error is its own, not
    a collective broken by another's exit (rank 0 raises that within milliseconds of a peer dying, and
    may be the first seen)."""
    failed = [r for r in ranks if ended.get(r.rank, 0) != 0]
    killed = [r for r in failed if ended[r.rank] < 0 and r.error() is None]
    own = [r for r in failed if r.error() is not None and not (r.error() or "").startswith("collective: ")]
    return (killed or own or [seen])[0]


def _stop_all(ranks: list[Rank]) -> None:
    """SIGTERM to every rank still running (and what it started), SIGKILL to any left after GRACE_S."""
    for r in ranks:
        if r.process.poll() is None:
            r.signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(r.process.poll() is None for r in ranks):
        time.sleep(POLL_S)
    for r in ranks:
        r.signal(signal.SIGKILL)  # the rank if it is still there, and whatever it started in its session
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.process.wait(timeout=5)


@contextlib.contextmanager
def _handling(handler: object) -> Iterator[None]:
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}  # type: ignore[arg-type]
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def world_size(cfg: HoneConfig) -> int:
    """`trainer.world_size`, or under torchrun (or `hone train`'s own launch) `WORLD_SIZE`: they must
    agree when both are set."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return cfg.trainer.world_size
    world = int(os.environ["WORLD_SIZE"])
    if cfg.trainer.world_size not in (1, world):
        raise ConfigError(f"trainer.world_size is {cfg.trainer.world_size} but WORLD_SIZE is {world}")
    cfg.trainer.world_size = world
    return world


def check_devices(cfg: HoneConfig, world: int) -> None:
    """Set-up errors of N ranks, one line before any rank starts."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        raise ConfigError("trainer.world_size > 1 needs torch.distributed with gloo; this torch has none")
    wants_gpu = cfg.model.device.startswith("cuda") or (
        cfg.model.device == "auto" and torch.cuda.is_available()
    )
    if wants_gpu:
        count = torch.cuda.device_count()
        if world > count:
            raise ConfigError(f"trainer.world_size={world} needs one GPU per rank; this machine has {count}")
        if not dist.is_nccl_available():
            raise ConfigError("trainer.world_size > 1 on GPUs needs NCCL; this torch has none")

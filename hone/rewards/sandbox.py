"""Run untrusted, model-written Python in a sandbox.

Threat model: the program is hostile. It may loop forever, allocate without bound, fork-bomb, print
gigabytes, write anywhere, read secrets (environment variables, API-key files, `/proc/<trainer>/
environ`), open sockets, signal the trainer, leave daemons behind or fill the disk. The trainer must
survive every one of these and each call must return within `timeout_s` plus a small margin.

Two layers, both real OS mechanisms:

* **Process limits** (always): a fresh session and process group, a scrubbed environment, a fresh
  temporary working directory, and hard rlimits set before the program starts and which it cannot
  raise: address space (`memory_mb`), CPU seconds, file size (output and disk, `max_file_mb`), open
  files, core dumps off, number of processes. When the trainer runs as root, the program runs as a
  dedicated unprivileged uid per concurrent slot (`SANDBOX_UID_BASE + slot`), so files private to the
  trainer's user are unreadable, signals to the trainer fail with EPERM, `RLIMIT_NPROC` applies
  (the kernel ignores it for root), and stragglers of that uid are killed after every call.
* **Namespaces via bubblewrap** (`isolation="bwrap"`, the default when `bwrap` works on the machine):
  new PID, network, IPC, UTS, mount (and, unprivileged, user) namespaces. The program sees a
  read-only `/usr` + the Python install, a fresh `/proc` showing only its own processes, no network
  but its own loopback, and size-capped tmpfs at `/work` (its cwd) and `/tmp`; nothing of `/home`,
  `/root` or the project. When the call ends, the PID namespace dies and takes every descendant with
  it, whatever `setsid`/double-fork tricks the program played.

Without bubblewrap (`isolation="process"`) only the first layer holds: the program can read files its
uid can read, write to world-writable directories (`/tmp`), open network connections, and, when the
trainer is not root, signal the trainer's processes. `isolation="auto"` picks bwrap when it works and
logs a warning once when it falls back. See README "Reward sandbox" for the table.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO, Literal

logger = logging.getLogger(__name__)

Isolation = Literal["auto", "bwrap", "process"]
SANDBOX_UID_BASE = 1_960_000_000  # far above any real account; one uid per concurrent slot
_KILL_MARGIN_S = 0.5  # extra wall time granted for interpreter start before the kill
_MAX_READ = 1 << 20

# Runs inside the sandbox, before any untrusted code: limits and privileges can only go down from
# here. `cfg` arrives as argv[1]. The program's source is read from a file in the working directory.
_BOOT = r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
for name, value in cfg["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
if cfg["uid"] is not None and os.getuid() == 0:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
del cfg, json, resource
sys.argv = ["solution.py"]
__file__ = "solution.py"
with open("solution.py") as f:
    exec(compile(f.read(), "solution.py", "exec"))
"""


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed by a signal
    timed_out: bool
    killed_reason: str | None = None  # "timeout", "memory", "cpu", "output/file size", "signal N"
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class SandboxOptions:
    timeout_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_file_mb: int = 16  # per file, stdout/stderr included
    max_open_files: int = 64
    tmpfs_mb: int = 64  # size of /work and /tmp under bwrap
    max_output_bytes: int = 64 * 1024  # returned to the caller; the rest is dropped
    python: str | None = None  # interpreter for the program; default: the trainer's base interpreter


class _Slots:
    """The concurrency limit, and a distinct uid for each running program. Ids rotate FIFO through
    `ID_SPARE` × more ids than may run at once, so a uid whose fork bomb's zombies are still waiting
    for init to reap them (they count against RLIMIT_NPROC) rests for a while before it is reused.
    Resizing while programs run is safe: an id beyond the new range is retired when released."""

    ID_SPARE = 4

    def __init__(self, n: int) -> None:
        self._cond = threading.Condition()
        self._size = 0
        self._free: list[int] = []
        self._busy: set[int] = set()
        self.resize(n)

    def resize(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"sandbox concurrency must be ≥ 1, got {n}")
        with self._cond:
            self._size = n
            ids = range(n * self.ID_SPARE)
            self._free = [s for s in self._free if s in ids]
            self._free += [s for s in ids if s not in self._free and s not in self._busy]
            self._cond.notify_all()

    def acquire(self) -> int:
        with self._cond:
            while len(self._busy) >= self._size or not self._free:
                self._cond.wait()
            slot = self._free.pop(0)
            self._busy.add(slot)
            return slot

    def release(self, slot: int) -> None:
        with self._cond:
            self._busy.discard(slot)
            if slot < self._size * self.ID_SPARE and slot not in self._free:
                self._free.append(slot)
            self._cond.notify()


_slots = _Slots(os.cpu_count() or 2)


def set_max_concurrency(n: int) -> None:
    """How many sandboxed programs may run at once (default: the CPU count). Call before scoring."""
    _slots.resize(n)


@functools.cache
def bwrap_available() -> bool:
    """Whether bubblewrap is installed *and* can create namespaces here (it can't in some containers)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    probe = [exe, *_bwrap_args("", 1 << 20, _sandbox_uid(0)), "--", _python(), "-I", "-S", "-c", "pass"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def _warn_fallback() -> None:
    logger.warning(
        "bubblewrap is not usable here: the code sandbox falls back to process limits only "
        "(no network or file-system isolation; see README 'Reward sandbox'). Install bubblewrap."
    )


def resolve_isolation(isolation: Isolation) -> Literal["bwrap", "process"]:
    if isolation not in ("auto", "bwrap", "process"):
        raise ValueError(f"sandbox isolation must be 'auto', 'bwrap' or 'process', got {isolation!r}")
    if isolation == "process":
        return "process"
    if bwrap_available():
        return "bwrap"
    if isolation == "bwrap":
        raise RuntimeError("isolation='bwrap' but bubblewrap is not installed or cannot create namespaces")
    _warn_fallback()
    return "process"


def run_python(
    code: str,
    stdin: str = "",
    timeout_s: float | None = None,
    memory_mb: int | None = None,
    *,
    limits: SandboxOptions | None = None,
    isolation: Isolation = "auto",
) -> SandboxResult:
    """Run `code` as a Python program with `stdin`; never raises for anything the program does.
    `timeout_s`/`memory_mb`, when given, override those of `limits` (defaults 5 s, 512 MB)."""
    limits = limits or SandboxOptions()
    overrides = {"timeout_s": timeout_s, "memory_mb": memory_mb}
    limits = SandboxOptions(**{**vars(limits), **{k: v for k, v in overrides.items() if v is not None}})
    mode = resolve_isolation(isolation)
    if mode == "process" and _can_switch_uid() and not _runnable_by_others(_python(limits)):
        raise RuntimeError(
            f"process isolation drops root to an unprivileged uid, which cannot run {_python(limits)} "
            "(a parent directory is private); pass an interpreter other users can run "
            "(e.g. python='/usr/bin/python3'), or install bubblewrap"
        )
    slot = _slots.acquire()
    try:
        return _run(code, stdin, limits, mode, slot)
    finally:
        _slots.release(slot)


def _python(options: SandboxOptions | None = None) -> str:
    """The base interpreter (a venv's python is a symlink into a prefix the sandbox may not see)."""
    if options is not None and options.python:
        return os.path.realpath(shutil.which(options.python) or options.python)
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _runnable_by_others(path: str) -> bool:
    """Whether a dropped-privilege uid can reach `path` (a pyenv under a 0700 /root is not)."""
    return all(os.stat(p).st_mode & 0o001 for p in _ancestors(path)) and bool(os.stat(path).st_mode & 0o005)


def _sandbox_uid(slot: int) -> int | None:
    return SANDBOX_UID_BASE + slot if _can_switch_uid() else None


@functools.cache
def _can_switch_uid() -> bool:
    """Root that can become another uid (not so in a rootless container, where root is itself mapped)."""
    if os.geteuid() != 0:
        return False
    try:
        uid = SANDBOX_UID_BASE
        subprocess.run(["true"], user=uid, group=uid, extra_groups=[], check=True, capture_output=True)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


def _rlimits(limits: SandboxOptions) -> dict[str, int]:
    mb = 1 << 20
    return {
        "RLIMIT_AS": limits.memory_mb * mb,
        "RLIMIT_CPU": int(limits.timeout_s) + 1,
        "RLIMIT_FSIZE": limits.max_file_mb * mb,
        "RLIMIT_NOFILE": limits.max_open_files,
        "RLIMIT_NPROC": limits.max_processes,
        "RLIMIT_CORE": 0,
    }


def _bwrap_args(workdir: str, tmpfs_bytes: int, uid: int | None) -> list[str]:
    args = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    args += ["--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if uid is None:
        args += ["--unshare-user"]  # unprivileged: a user namespace is what lets bwrap make the others
    else:
        # Root: no user namespace, so the setuid in _BOOT lands on a real unprivileged kernel uid
        # (inside a userns mapped to root, RLIMIT_NPROC would not apply).
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    for path in ("/usr", "/etc/ld.so.cache", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    prefix = os.path.realpath(sys.base_prefix)
    if not prefix.startswith("/usr/"):
        # bwrap copies each parent's mode from the host: a 0700 /root would hide a pyenv under it.
        parents = [p for p in _ancestors(prefix) if p != "/"]
        args += [arg for p in parents for arg in ("--perms", "0755", "--dir", p)]
        args += ["--ro-bind", prefix, prefix]
    size = str(tmpfs_bytes)
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        "1048576",
        "--tmpfs",
        "/dev/shm",
    ]
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    args += ["--perms", "0777", "--size", size, "--tmpfs", "/work"]
    args += ["--ro-bind", os.path.join(workdir, "solution.py"), "/work/solution.py"] if workdir else []
    args += ["--chdir", "/work", "--clearenv"]
    return args


def _ancestors(path: str) -> list[str]:
    parts = []
    while (parent := os.path.dirname(path)) != path:
        parts.append(parent)
        path = parent
    return parts[::-1]


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


def _command(workdir: str, limits: SandboxOptions, mode: str, uid: int | None) -> list[str]:
    cfg = json.dumps({"rlimits": _rlimits(limits), "uid": uid})
    python = [_python(limits), "-I", "-c", _BOOT, cfg]
    if mode == "process":
        return python
    env = [arg for key, value in _env("/work").items() for arg in ("--setenv", key, value)]
    return [
        shutil.which("bwrap") or "bwrap",
        *_bwrap_args(workdir, limits.tmpfs_mb << 20, uid),
        *env,
        *python,
    ]


def _run(code: str, stdin: str, limits: SandboxOptions, mode: str, slot: int) -> SandboxResult:
    uid = _sandbox_uid(slot)
    workdir = tempfile.mkdtemp(prefix="hone-sandbox-")
    try:
        with open(os.path.join(workdir, "solution.py"), "w") as f:
            f.write(code)
        if uid is not None and mode == "process":
            os.chown(workdir, uid, uid)  # the program's own, writable cwd
        os.chmod(workdir, 0o755)
        return _execute(workdir, stdin, limits, mode, uid)
    finally:
        if uid is not None:
            _kill_uid(uid)
            if mode == "process":
                _remove_leftovers(uid)
        shutil.rmtree(workdir, ignore_errors=True)


def _execute(workdir: str, stdin: str, limits: SandboxOptions, mode: str, uid: int | None) -> SandboxResult:
    # Output goes to files, not pipes: RLIMIT_FSIZE then caps it in the kernel, and the trainer never
    # buffers more than it reads back.
    # stdin is a pipe, not a file: what was read is gone, so a test harness's secrets can't be re-read.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            _command(workdir, limits, mode, uid),
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            cwd=workdir,
            env=_env(workdir),
            start_new_session=True,
            close_fds=True,
        )
        feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True)
        feeder.start()
        timed_out = False
        try:
            proc.wait(timeout=limits.timeout_s + _KILL_MARGIN_S)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
            feeder.join(timeout=1.0)
        duration = time.monotonic() - start
        stdout, cut_out = _read(out, limits.max_output_bytes)
        stderr, cut_err = _read(err, limits.max_output_bytes)
    code = proc.returncode
    exit_code = code if code is not None and code >= 0 and not timed_out else None
    reason = _killed_reason(code, timed_out, stderr)
    return SandboxResult(stdout, stderr, exit_code, timed_out, reason, cut_out or cut_err, duration)


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    with contextlib.suppress(OSError):  # the program exited without reading it all
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # its session: the program or bwrap, and their group
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _kill_uid(uid: int) -> None:
    """Kill every process of the sandbox uid (e.g. a daemon that left the process group) and wait
    until the kernel has reaped them: zombies still count against the next call's RLIMIT_NPROC.
    `kill -1` run *as that uid* can reach exactly that uid's processes."""
    deadline = time.monotonic() + 2.0
    while _processes_of(uid) and time.monotonic() < deadline:
        subprocess.run(
            ["kill", "-9", "-1"], user=uid, group=uid, extra_groups=[], capture_output=True, check=False
        )
        time.sleep(0.005)


def _processes_of(uid: int) -> bool:
    with os.scandir("/proc") as entries:
        for entry in entries:
            try:
                if entry.name.isdigit() and entry.stat().st_uid == uid:
                    return True
            except OSError:  # exited while we looked
                continue
    return False


def _remove_leftovers(uid: int) -> None:
    """Process mode: files the program left in the world-writable directories it could reach."""
    for shared in ("/tmp", "/var/tmp", "/dev/shm"):
        with contextlib.suppress(OSError), os.scandir(shared) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)


def _read(file: object, limit: int) -> tuple[str, bool]:
    file.seek(0)  # type: ignore[attr-defined]
    data = file.read(min(limit, _MAX_READ) + 1)  # type: ignore[attr-defined]
    return data[:limit].decode(errors="replace"), len(data) > limit


def _killed_reason(code: int | None, timed_out: bool, stderr: str) -> str | None:
    if timed_out:
        return "timeout"
    if code is None or code >= 0:
        if code and "MemoryError" in stderr:
            return "memory"
        if code == 137 or code == 128 + signal.SIGXCPU:  # bwrap reports its child's signal as 128+N
            return "cpu" if code != 137 else "signal 9"
        return None
    sig = -code
    return {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "output/file size", signal.SIGKILL: "signal 9"}.get(
        sig, f"signal {sig}"
    )

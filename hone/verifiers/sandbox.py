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
  dedicated unprivileged uid (`SANDBOX_UID_BASE + n`, held for the call by one program on the whole
  machine, whichever trainer process runs it; see `_uid_lease`), so files private to the
  trainer's user are unreadable, signals to the trainer fail with EPERM, `RLIMIT_NPROC` applies
  (the kernel ignores it for root), and stragglers of that uid are killed after every call. In
  process mode a watchdog between the trainer and the program (see `_BOOT`) kills every descendant
  of the program when the call ends or the trainer dies, however it dies. If the unprivileged uid
  cannot run the trainer's interpreter (a pyenv under a private home), a system `python3` runs it.
* **Namespaces via bubblewrap** (`isolation="bwrap"`, the default when `bwrap` works on the machine):
  new PID, network, IPC, UTS, mount (and, unprivileged, user) namespaces. The program sees a
  read-only `/usr` + the Python install, a fresh `/proc` showing only its own processes, no network
  but its own loopback, and size-capped tmpfs at `/work` (its cwd) and `/tmp`; nothing of `/home`,
  `/root` or the project. When the call ends, the PID namespace dies and takes every descendant with
  it, whatever `setsid`/double-fork tricks the program played; `--die-with-parent` ends it with the
  trainer.

Without bubblewrap (`isolation="process"`) the boot code still enters namespaces before it drops
privileges: a network namespace (no network, not even the host's loopback, where an agent endpoint, an
OpenEnv or reward-model server or a Ray dashboard may listen) and, as root, a mount namespace with a
private size-capped tmpfs at `/tmp` (its working directory) and `/dev/shm`; not root, the network
namespace is made inside an unprivileged user namespace, where the kernel allows one (else a warning
says once that the network is open). Otherwise the first layer holds alone: the program can read files
its uid can read and, when the trainer is not root, signal the trainer's processes. `isolation="auto"`
picks bwrap when it works and logs a warning once when it falls back. The table of what each mode
contains: docs/concepts/rewards-and-eval.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Literal

logger = logging.getLogger(__name__)

Isolation = Literal["auto", "bwrap", "process"]
SANDBOX_UID_BASE = 1_960_000_000  # far above any real account; one uid per running program
_UID_POOL = 4096  # uids SANDBOX_UID_BASE + [0, _UID_POOL), shared by all trainer processes on the machine
# Where the uid leases' lock files live: root-only, since the programs run as other uids.
_UID_LOCK_DIRS = ("/run/hone-sandbox", os.path.join(tempfile.gettempdir(), "hone-sandbox-uids"))
_PROBE_UID = SANDBOX_UID_BASE - 1  # set-up probes: never a slot's uid, so no call's cleanup kills them
# Process isolation as root: where to look for an interpreter every uid can run (see _shared_python).
_SHARED_PYTHON_DIRS = ("/usr/local/bin", "/usr/bin")
_MIN_SANDBOX_PYTHON = (3, 9)  # the boot code's os.waitstatus_to_exitcode
_KILL_MARGIN_S = 0.5  # extra wall time granted for interpreter start before the kill
_MAX_READ = 1 << 20

# Runs inside the sandbox, before any untrusted code: limits and privileges can only go down from
# here. `cfg` arrives as argv[1]. The program's source is read from a file in the working directory.
# Process mode: this process stays behind as the program's watchdog, so that nothing the program
# started outlives the trainer, even a SIGKILLed one (under bwrap, --die-with-parent and the PID
# namespace do that). The kernel tells it of the trainer's death (PR_SET_PDEATHSIG; it fires when the
# *thread* that spawned it exits, and that thread is blocked in run_python until the call is over). As
# a child subreaper it inherits every orphaned descendant (setsid + double fork included), so it can
# kill them all: when the trainer dies or ends the call (both send it SIGTERM), and when the program
# exits (SIGCHLD). The program itself gets SIGKILL when the watchdog dies.
_BOOT = r"""
import os, sys


def _boot():
    import json, resource, signal
    cfg = json.loads(sys.argv[1])
    PDEATHSIG, SUBREAPER = 1, 36

    def live_children():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            except (OSError, IndexError, ValueError):
                continue
            if int(ppid) == watchdog and state != "Z":
                found.append(int(pid))
        return found

    def end(status):
        # Killed ones' orphans become our children: repeat until none lives. Reap only then: a zombie
        # holds its RLIMIT_NPROC slot, so a fork bomb cannot refill the ranks meanwhile. Done only
        # when the kernel says no child is left, not when a scan found none alive: a scan reads one
        # pid after another, and misses an orphan read (lower pid, after wrap-around) before its
        # parent died later in the scan.
        while True:
            while kids := live_children():
                for pid in kids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                break
        code = 128 + signal.SIGKILL if status is None else os.waitstatus_to_exitcode(status)
        if code < 0:  # died of a signal: so do we, and the trainer sees which
            signal.signal(-code, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})
            os.kill(watchdog, -code)
        os._exit(code if code >= 0 else 128 - code)

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    watchdog = os.getpid()
    if cfg["trainer"] is not None:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(SUBREAPER, 1, 0, 0, 0)
        # SIGTERM and SIGCHLD stay pending until sigwaitinfo takes them. Not a handler: Python runs
        # one only when the blocking call returns EINTR, and a signal that lands while the kernel
        # restarts that call (after the trainer's SIGSTOP + SIGCONT) restarts it instead; the
        # watchdog then waits for a frozen program while the trainer's grace runs out.
        awaited = {signal.SIGTERM, signal.SIGCHLD}
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, awaited)
        prctl(PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != cfg["trainer"]:  # it died before prctl
            end(None)
        program = os.fork()
        if program:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # stdin is the program's alone
            while signal.sigwaitinfo(awaited).si_signo == signal.SIGCHLD:
                done, status = os.waitpid(program, os.WNOHANG)
                if done:
                    end(status)
            end(None)
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    if cfg["namespaces"]:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        NEWNS, NEWNET, NEWUSER = 0x00020000, 0x40000000, 0x10000000
        root = os.getuid() == 0
        # Not root: a user namespace is what lets an unprivileged process make the network one.
        if libc.unshare(NEWNET | (NEWNS if root else NEWUSER)) != 0:
            os.write(2, b"sandbox: could not enter a network namespace; the program did not run\n")
            os._exit(125)
        REC, PRIVATE, NOSUID, NODEV = 0x4000, 0x40000, 0x2, 0x4
        if root and libc.mount(b"none", b"/", None, REC | PRIVATE, None) == 0:
            # A private, size-capped /tmp and /dev/shm, and the working directory inside the new /tmp.
            with open("solution.py", "rb") as f:
                source = f.read()
            size = f"size={cfg['tmpfs_bytes']},mode=1777".encode()
            targets = (b"/tmp", b"/dev/shm")
            if all(libc.mount(b"tmpfs", t, b"tmpfs", NOSUID | NODEV, size) == 0 for t in targets):
                os.mkdir("/tmp/work", 0o755)
                if cfg["uid"] is not None:
                    os.chown("/tmp/work", cfg["uid"], cfg["uid"])
                os.chdir("/tmp/work")
                with open("solution.py", "wb") as f:
                    f.write(source)
                os.environ["HOME"] = os.environ["TMPDIR"] = "/tmp/work"
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if cfg["uid"] is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    if cfg["trainer"] is not None:
        prctl(PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        if os.getppid() != watchdog:
            os._exit(128 + signal.SIGKILL)


_boot()
del _boot
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
    """The concurrency limit, and a distinct id for each running program, where its uid lease starts
    looking (`_uid_lease`). Ids rotate FIFO through `ID_SPARE` × more ids than may run at once, so a
    uid whose fork bomb's zombies are still waiting for init to reap them (they count against
    RLIMIT_NPROC) rests for a while before it is reused. Resizing while programs run is safe: an id
    beyond the new range is retired when released."""

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
    uid = _PROBE_UID if _can_switch_uid() else None
    probe = [exe, *_bwrap_args("", 1 << 20, uid), "--", _python(), "-I", "-S", "-c", "pass"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def _warn_fallback() -> None:
    logger.warning(
        "bubblewrap is not usable here: the code sandbox falls back to process isolation (limits, a "
        "network namespace, as root an unprivileged uid and a private /tmp; the host's files stay "
        "readable where permissions allow; see docs/concepts/rewards-and-eval.md). Install bubblewrap."
    )


# Process mode's namespaces, entered by the boot code before it drops privileges: CLONE_NEWNET (and, as
# root, CLONE_NEWNS for a private /tmp and /dev/shm; not root, CLONE_NEWUSER, which lets an unprivileged
# process create the network namespace where the kernel allows unprivileged user namespaces).
_PROBE_NAMESPACES = """
import ctypes, os, sys
flags = 0x40000000 | (0x00020000 if os.getuid() == 0 else 0x10000000)
sys.exit(0 if ctypes.CDLL(None, use_errno=True).unshare(flags) == 0 else 1)
"""


@functools.cache
def _namespaces_available() -> bool:
    """Whether process mode can put a program in a network namespace of its own here; says once when not."""
    try:
        probe = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE_NAMESPACES], timeout=30, check=False)
        available = probe.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        available = False
    if not available:
        logger.warning(
            "code sandbox: this machine allows no network namespace to an unprivileged process (no "
            "bubblewrap, not root, unprivileged user namespaces off): sandboxed programs can open network "
            "connections, loopback services beside the trainer included. See README 'Reward sandbox'."
        )
    return available


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
    limits = dataclasses.replace(limits, python=_interpreter(limits.python, mode))
    slot = _slots.acquire()
    try:
        return _run(code, stdin, limits, mode, slot)
    finally:
        _slots.release(slot)


def _python(name: str | None = None) -> str:
    """`name` (a path or a command on PATH), else the base interpreter (a venv's python is a symlink
    into a prefix the sandbox may not see)."""
    if name:
        return os.path.realpath(shutil.which(name) or name)
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _interpreter(python: str | None, mode: str) -> str:
    """The interpreter the program runs under. Process isolation as root runs it as an unprivileged
    uid, which cannot run the trainer's own when that sits under a private directory (a pyenv in a
    0700 /root); bwrap re-creates the parents with open modes, so it can."""
    chosen = _python(python)
    if mode == "bwrap" or not _can_switch_uid() or _runnable_by_others(chosen):
        return chosen
    if python is None:
        return _shared_python()
    raise RuntimeError(
        f"process isolation drops root to an unprivileged uid, which cannot run {chosen} "
        "(a parent directory is private); pass an interpreter other users can run "
        "(e.g. python='/usr/bin/python3'), or install bubblewrap"
    )


@functools.cache
def _shared_python() -> str:
    """An interpreter every uid can run, preferring the trainer's Python version; warns once.
    Only the sandbox's own boot code and the code reward's harness (stdlib only) must run on it."""
    own = _python()
    names = [f"python{sys.version_info.major}.{sys.version_info.minor}", "python3"]
    for path in [os.path.realpath(os.path.join(d, n)) for n in names for d in _SHARED_PYTHON_DIRS]:
        if not (os.path.isfile(path) and _runnable_by_others(path)):
            continue
        version = _version_for_others(path)
        if version is not None and version >= _MIN_SANDBOX_PYTHON:
            logger.warning(
                "the trainer's Python (%s) is under a private directory that the sandbox's unprivileged "
                "uid cannot enter: sandboxed programs run under %s (Python %d.%d, its own site-packages) "
                "instead. Install bubblewrap to run them under the trainer's Python.",
                own,
                path,
                *version,
            )
            return path
    minimum = ".".join(map(str, _MIN_SANDBOX_PYTHON))
    raise RuntimeError(
        f"the code sandbox cannot run here: without bubblewrap it drops root to an unprivileged uid, which "
        f"cannot run {own} (a parent directory is private), and no python3 >= {minimum} other users can "
        f"run is in {' or '.join(_SHARED_PYTHON_DIRS)}; install bubblewrap (apt-get install bubblewrap) "
        "or a system python3 (apt-get install python3)"
    )


def _version_for_others(path: str) -> tuple[int, int] | None:
    """The (major, minor) of `path` when the sandbox's unprivileged uid can really start it."""
    probe = [path, "-I", "-S", "-c", "import sys; print(*sys.version_info[:2])"]
    try:
        done = subprocess.run(
            probe,
            user=_PROBE_UID,
            group=_PROBE_UID,
            extra_groups=[],
            cwd="/",
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    fields = done.stdout.split()
    if done.returncode != 0 or len(fields) != 2 or not all(f.isdigit() for f in fields):
        return None
    return int(fields[0]), int(fields[1])


def _runnable_by_others(path: str) -> bool:
    """Whether a dropped-privilege uid can reach `path` (a pyenv under a 0700 /root is not)."""
    return all(os.stat(p).st_mode & 0o001 for p in _ancestors(path)) and bool(os.stat(path).st_mode & 0o005)


@contextlib.contextmanager
def _uid_lease(slot: int) -> Iterator[int | None]:
    """The uid one call runs its program as (None unless root), held by no other call on the machine
    until its cleanup is done. Slots are per process but uids machine-wide: two trainer processes
    (torchrun ranks, pytest-xdist workers) sharing a uid would share its RLIMIT_NPROC, and one call's
    cleanup (`kill -1` as that uid, deleting its files) would kill the other's program and delete its
    working directory. An flock holds the uid; the kernel drops it when the holder dies, even by
    SIGKILL. The search starts at the slot's own uid, so a process's uids still rotate."""
    if not _can_switch_uid():
        yield None
        return
    directory = _uid_lock_dir()
    for k in range(_UID_POOL):
        uid = SANDBOX_UID_BASE + (slot + k) % _UID_POOL
        fd = os.open(os.path.join(directory, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"all {_UID_POOL} sandbox uids are in use on this machine (lock files in {directory})")


@functools.cache
def _uid_lock_dir() -> str:
    """A directory only root can write: a program must not take, or squat, another call's uid."""
    for path in _UID_LOCK_DIRS:
        with contextlib.suppress(OSError):  # exists, or cannot be made here (no /run, read-only)
            os.mkdir(path, 0o700)
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022:
                return path
    raise RuntimeError(
        "the code sandbox needs a directory only root can write for its uid locks: "
        + " or ".join(_UID_LOCK_DIRS)
    )


@functools.cache
def _can_switch_uid() -> bool:
    """Root that can become another uid (not so in a rootless container, where root is itself mapped)."""
    if os.geteuid() != 0:
        return False
    try:
        uid = _PROBE_UID
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
    trainer = os.getpid() if mode == "process" else None
    namespaces = mode == "process" and _namespaces_available()
    tmpfs_bytes = limits.tmpfs_mb << 20
    cfg = json.dumps(
        {
            "rlimits": _rlimits(limits),
            "uid": uid,
            "trainer": trainer,
            "namespaces": namespaces,
            "tmpfs_bytes": tmpfs_bytes,
        }
    )
    python = [_python(limits.python), "-I", "-c", _BOOT, cfg]
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
    with _uid_lease(slot) as uid:
        return _run_as(code, stdin, limits, mode, uid)


def _run_as(code: str, stdin: str, limits: SandboxOptions, mode: str, uid: int | None) -> SandboxResult:
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
            _kill_group(proc, mode)
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


def _kill_group(proc: subprocess.Popen[bytes], mode: str) -> None:
    if mode == "process" and proc.poll() is None:
        # The watchdog kills every descendant, also those that left the group. Freeze the group and
        # wake the watchdog alone first: a fork bomb's spinning processes would starve it of CPU.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGSTOP)
            os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
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


def _read(file: IO[bytes], limit: int) -> tuple[str, bool]:
    file.seek(0)
    data = file.read(min(limit, _MAX_READ) + 1)
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
    names: dict[int, str] = {
        signal.SIGXCPU: "cpu",
        signal.SIGXFSZ: "output/file size",
        signal.SIGKILL: "signal 9",
    }
    return names.get(sig, f"signal {sig}")

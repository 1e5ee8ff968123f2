"""The code sandbox against hostile programs: one test per attack, each asserting containment, that
the call returns within its timeout plus a margin, and that the host is unaffected afterwards (no
stray processes, no files outside the sandbox, this process alive).

Each attack runs under every isolation mode this machine offers: `bwrap` (namespaces) when bubblewrap
works here, and `process` (rlimits + a dedicated uid + network and mount namespaces entered by the boot
code) when the tests run as root; a trainer that is not root (an unprivileged user namespace for the
network) is exercised by switching a child process to `nobody`.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hone.verifiers import sandbox
from hone.verifiers.sandbox import SandboxOptions, run_python
from tests.conftest import needs_sandbox, sandbox_unavailable
from tests.helpers import wait_for

MARGIN_S = 3.0  # interpreter start + kill + cleanup, generous for a loaded 2-core CI machine
MODES = [
    pytest.param(
        "bwrap", marks=pytest.mark.skipif(not sandbox.bwrap_available(), reason="bubblewrap not usable here")
    ),
    pytest.param(
        "process",
        marks=pytest.mark.skipif(
            os.geteuid() != 0 or sandbox_unavailable("process") is not None,
            reason=sandbox_unavailable("process") or "process mode isolates the trainer only as root",
        ),
    ),
]
BWRAP = [MODES[0]]
PROCESS = [MODES[1]]
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def run(code: str, mode: str, timeout_s: float = 5, **kw: object) -> sandbox.SandboxResult:
    started = time.monotonic()
    result = run_python(textwrap.dedent(code), timeout_s=timeout_s, isolation=mode, **kw)  # type: ignore[arg-type]
    assert time.monotonic() - started < timeout_s + MARGIN_S
    return result


@pytest.fixture
def leased_uids(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The uids this test's calls ran programs as (root only). Not root, this process is meanwhile a child
    subreaper: whatever the calls' programs leave behind is re-parented to it, so `stray_processes` can
    count its own descendants rather than every sandboxed program on the machine."""
    leased: list[int] = []
    real_lease = sandbox._uid_lease

    @contextlib.contextmanager
    def recording_lease(slot: int) -> Iterator[int | None]:
        with real_lease(slot) as uid:
            if uid is not None:
                leased.append(uid)
            yield uid

    monkeypatch.setattr(sandbox, "_uid_lease", recording_lease)
    if os.geteuid() == 0:
        yield leased
        return
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield leased
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def descendants(root: int) -> set[int]:
    """The pids of `root`'s live descendants (its children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def idle_uids(uids: list[int], held: contextlib.ExitStack) -> set[int]:
    """Those of `uids` that no call runs a program as now, leased (as a call would) until `held` ends.
    Another process's call (the other pytest-xdist worker's) may hold one meanwhile: its processes are
    not ours, and its cleanup kills whatever that uid left."""
    idle = set()
    for uid in set(uids):
        fd = os.open(os.path.join(sandbox._uid_lock_dir(), str(uid)), os.O_RDWR)
        held.callback(os.close, fd)
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            idle.add(uid)
    return idle


def stray_processes(uids: list[int]) -> list[str]:
    """Live processes left by this test's calls: as root, those of the uids they ran programs as;
    otherwise, those of this process's descendants running the sandbox's boot code (see `leased_uids`:
    another pytest-xdist worker's programs are not ours)."""
    found = []
    ours = descendants(os.getpid()) if not uids else set()
    with contextlib.ExitStack() as held:
        idle = idle_uids(uids, held)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            uid = int(fields["Uid"].split()[0])
            zombie = fields["State"].strip().startswith("Z")
            if not zombie and (uid in idle if uids else int(pid) in ours and b"solution.py" in cmdline):
                found.append(f"{pid} uid={uid} {cmdline[:80]!r}")
    return found


def assert_no_strays(uids: list[int]) -> None:
    wait_for(lambda: not stray_processes(uids), 2.0)  # SIGKILLed processes take a moment to leave /proc
    assert stray_processes(uids) == []


@pytest.mark.parametrize("mode", MODES)
def test_a_well_behaved_program_gets_stdin_and_returns_stdout_and_exit_code(mode: str) -> None:
    result = run(
        "import sys\nprint(input()[::-1])\nprint('err', file=sys.stderr)\nsys.exit(3)", mode, stdin="abc\n"
    )
    assert (result.stdout, result.stderr, result.exit_code) == ("cba\n", "err\n", 3)
    assert not result.timed_out and result.killed_reason is None


@pytest.mark.parametrize("mode", MODES)
def test_an_infinite_loop_is_killed_at_the_wall_clock_timeout(mode: str, leased_uids: list[int]) -> None:
    result = run("while True:\n    pass", mode, timeout_s=1)
    assert result.timed_out and result.exit_code is None and result.killed_reason == "timeout"
    assert_no_strays(leased_uids)


@pytest.mark.parametrize("mode", MODES)
def test_cpu_time_is_capped_and_the_program_cannot_raise_its_limits(mode: str) -> None:
    result = run(
        """
        import resource
        print(resource.getrlimit(resource.RLIMIT_CPU))
        for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE"):
            try:
                resource.setrlimit(getattr(resource, name), (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
                print("raised", name)
            except (ValueError, OSError):
                print("refused", name)
        """,
        mode,
        timeout_s=2,
    )
    assert result.stdout.splitlines() == [
        "(3, 3)",
        "refused RLIMIT_CPU",
        "refused RLIMIT_AS",
        "refused RLIMIT_NPROC",
        "refused RLIMIT_FSIZE",
    ]


@pytest.mark.parametrize("mode", MODES)
def test_a_memory_bomb_fails_inside_the_sandbox(mode: str) -> None:
    result = run("chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))", mode, memory_mb=256)
    assert result.exit_code not in (0, None) or result.killed_reason is not None
    assert result.killed_reason == "memory"


@pytest.mark.parametrize("mode", MODES)
def test_a_fork_bomb_is_contained_and_leaves_nothing_behind(mode: str, leased_uids: list[int]) -> None:
    result = run(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        mode,
        timeout_s=2,
    )
    assert result.exit_code != 0
    assert_no_strays(leased_uids)
    assert run("print('still works')", mode).stdout == "still works\n"


@pytest.mark.parametrize("mode", MODES)
def test_huge_output_is_truncated_without_flooding_the_trainer(mode: str) -> None:
    limits = SandboxOptions(max_output_bytes=10_000)
    result = run("while True:\n    print('x' * 10_000)", mode, limits=limits)
    assert result.truncated and len(result.stdout) == 10_000 and set(result.stdout) <= {"x", "\n"}


@pytest.mark.parametrize("mode", MODES)
def test_the_trainers_environment_and_private_files_stay_secret(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HONE_TEST_API_KEY", "sk-env-7f3a")
    key_file = tmp_path / "token"
    key_file.write_text("sk-file-91bc")
    key_file.chmod(0o600)
    result = run(
        f"""
        import os, glob
        print(dict(os.environ))
        for path in [{str(key_file)!r}, "/proc/{os.getpid()}/environ", "/proc/1/environ",
                     *glob.glob("/proc/*/environ"), os.path.expanduser("~/.netrc")]:
            try:
                print(path, open(path, "rb").read())
            except OSError as e:
                print(path, type(e).__name__)
        """,
        mode,
    )
    seen = result.stdout + result.stderr
    assert result.exit_code == 0 and "sk-env-7f3a" not in seen and "sk-file-91bc" not in seen


@pytest.mark.parametrize("mode", MODES)
def test_the_program_cannot_signal_the_trainer(mode: str) -> None:
    result = run(
        f"""
        import os, signal
        for target in [{os.getpid()}, os.getppid(), -1, 1]:
            try:
                os.kill(target, signal.SIGKILL)
                print("sent", target)
            except OSError as e:
                print("refused", target, type(e).__name__)
        """,
        mode,
    )
    assert result.stdout  # it ran; and, since this line runs, the test process is alive
    assert f"sent {os.getpid()}" not in result.stdout


@pytest.mark.parametrize("mode", MODES)
def test_a_daemon_that_escapes_the_process_group_is_killed_after_the_call(
    mode: str, leased_uids: list[int]
) -> None:
    result = run(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        print("parent done")
        """,
        mode,
    )
    assert result.stdout == "parent done\n", result.stderr
    assert_no_strays(leased_uids)


@pytest.mark.parametrize("mode", MODES)
def test_writes_outside_the_sandbox_never_reach_the_host(mode: str, tmp_path: Path) -> None:
    host_targets = [tmp_path / "planted.txt", Path.home() / f"hone-escape-{uuid.uuid4().hex}"]
    result = run(
        f"""
        for path in {[str(p) for p in host_targets]!r} + ["/usr/hone-escape", "/etc/hone-escape"]:
            try:
                open(path, "w").write("pwned")
                print("wrote", path)
            except OSError as e:
                print("refused", path)
        open("scratch.txt", "w").write("own dir is fine")
        print(open("scratch.txt").read())
        """,
        mode,
    )
    assert result.stdout.rstrip().endswith("own dir is fine")
    assert not any(p.exists() for p in host_targets)
    assert not Path("/usr/hone-escape").exists() and not Path("/etc/hone-escape").exists()


@pytest.mark.parametrize("mode", MODES)
def test_world_writable_directories_are_private_to_each_call(mode: str) -> None:
    name = f"/tmp/hone-escape-{uuid.uuid4().hex}"
    result = run(f"open({name!r}, 'w').write('x'); open('/dev/shm/x', 'w').write('x'); print('ok')", mode)
    assert result.stdout == "ok\n" and not Path(name).exists()


@pytest.mark.parametrize("mode", MODES)
def test_no_network_not_even_the_hosts_loopback(mode: str) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def serve() -> None:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            try:
                accepted.append(server.accept())
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    result = run(
        f"""
        import socket
        for host in ["127.0.0.1", "10.0.0.1", "1.1.1.1"]:
            try:
                socket.create_connection((host, {port}), timeout=1)
                print("connected", host)
            except OSError as e:
                print("refused", host, type(e).__name__)
        """,
        mode,
    )
    server.close()
    thread.join()
    assert "connected" not in result.stdout and result.stdout.count("refused") == 3
    assert accepted == []


@pytest.mark.parametrize("mode", MODES)
def test_filling_the_disk_stops_at_the_sandbox_quota(mode: str) -> None:
    limits = SandboxOptions(tmpfs_mb=8, max_file_mb=4)
    result = run(
        """
        written = 0
        for directory in [".", "/tmp"]:
            for i in range(1000):
                try:
                    with open(f"{directory}/fill{i}", "wb") as f:
                        for _ in range(4):
                            f.write(b"x" * (1 << 20))
                            written += 1 << 20
                except OSError:
                    break
        print(written >> 20)
        """,
        mode,
        limits=limits,
    )
    assert 0 < int(result.stdout) <= 2 * 8  # megabytes: two 8 MB tmpfs, and nothing more


@needs_sandbox
def test_concurrency_is_bounded_by_the_slot_pool() -> None:
    sandbox.set_max_concurrency(2)
    try:
        in_flight, peak, lock = 0, 0, threading.Lock()
        real_run = sandbox._run

        def counting_run(*args: object) -> sandbox.SandboxResult:
            nonlocal in_flight, peak
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            try:
                return real_run(*args)  # type: ignore[arg-type]
            finally:
                with lock:
                    in_flight -= 1

        sandbox._run = counting_run  # type: ignore[assignment]
        threads = [
            threading.Thread(target=run_python, args=("import time; time.sleep(0.2)",)) for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert peak == 2
    finally:
        sandbox._run = real_run  # type: ignore[assignment]
        sandbox.set_max_concurrency(os.cpu_count() or 2)


def test_isolation_bwrap_fails_loudly_where_bubblewrap_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox, "bwrap_available", lambda: False)
    with pytest.raises(RuntimeError, match="bubblewrap is not installed"):
        run_python("print(1)", isolation="bwrap")
    assert sandbox.resolve_isolation("auto") == "process"


# --- a fresh machine: root, no bubblewrap, the trainer's Python under a private home ---


@pytest.fixture
def private_trainer_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Pretend the trainer's interpreter sits in a 0700 directory (a pyenv under /root)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    fake = home / "python3"
    fake.write_text("")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "_base_executable", str(fake))
    sandbox._shared_python.cache_clear()
    yield str(fake)
    sandbox._shared_python.cache_clear()


@pytest.mark.parametrize("mode", PROCESS)
def test_a_private_trainer_python_falls_back_once_to_one_every_uid_can_run(
    mode: str, private_trainer_python: str, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(2):
        result = run("import sys; print(sys.executable)", mode)
        assert result.exit_code == 0, result.stderr
        used = result.stdout.strip()
        assert used != private_trainer_python and os.path.realpath(used).startswith("/usr/")
    warnings = [r for r in caplog.records if "private directory" in r.getMessage()]
    assert len(warnings) == 1 and used in warnings[0].getMessage()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops to an unprivileged uid")
def test_no_interpreter_other_uids_can_run_is_one_clear_error_at_setup(
    private_trainer_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hone.rewards.code import code

    if not sandbox._can_switch_uid():
        pytest.skip("root cannot switch uid here (rootless container)")
    monkeypatch.setattr(sandbox, "_SHARED_PYTHON_DIRS", (str(tmp_path / "empty"),))
    with pytest.raises(
        RuntimeError, match=r"install bubblewrap \(apt-get install bubblewrap\) or a system python3"
    ):
        code(isolation="process")


# --- sandboxed programs never outlive the trainer ---

# The program leaves three processes whose command line carries `marker`: itself, a child in its
# process group, and a daemon that left the session (setsid + double fork).
SPAWN_THREE = """
import os, sys
def park():
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", {marker!r}])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        park()
    os._exit(0)
if os.fork() == 0:
    park()
park()
"""

# A trainer that calls the sandbox from a worker thread (as reward scoring and tools do). It loads
# sandbox.py alone: importing `hone` would cost seconds of torch.
TRAINER = """
import importlib.util, sys
from concurrent.futures import ThreadPoolExecutor
spec = importlib.util.spec_from_file_location("sandbox", {path!r})
sandbox = importlib.util.module_from_spec(spec)
sys.modules["sandbox"] = sandbox
spec.loader.exec_module(sandbox)
with ThreadPoolExecutor(1) as pool:
    result = pool.submit(sandbox.run_python, {program!r}, timeout_s=60, isolation={mode!r}).result()
print(result.stdout, end="")
"""


def live_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline.split(b"\0") and state != "Z":
            found.append(int(pid))
    return found


@pytest.mark.parametrize("mode", MODES)
def test_sandboxed_programs_and_their_descendants_die_with_a_killed_trainer(mode: str) -> None:
    marker = f"hone-test-{uuid.uuid4().hex}"
    program = SPAWN_THREE.format(marker=marker)
    script = TRAINER.format(path=sandbox.__file__, program=program, mode=mode)
    trainer = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(lambda: len(live_with(marker)) >= 3 or trainer.poll() is not None, 30)
        assert len(live_with(marker)) == 3
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    wait_for(lambda: not live_with(marker), 3.0)
    left = live_with(marker)
    for pid in left:  # don't leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert left == []


@pytest.mark.parametrize("mode", PROCESS)
@pytest.mark.parametrize("ends", ["exits", "times out"])
def test_the_watchdog_alone_kills_every_descendant_after_the_call(
    mode: str, ends: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What holds for a trainer that is not root, where no dedicated uid is cleaned up after the call."""
    monkeypatch.setattr(sandbox, "_kill_uid", lambda uid: None)
    marker = f"hone-test-{uuid.uuid4().hex}"
    program = SPAWN_THREE.format(marker=marker)
    if ends == "exits":
        program = program.rsplit("park()", 1)[0] + "print('done')\n"
    result = run(program, mode, timeout_s=1)
    left = live_with(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert (result.stdout, result.timed_out) == (("done\n", False) if ends == "exits" else ("", True))
    assert left == []


# Pid wrap-around: a session leader forks until its child gets a lower pid than its own, so that a scan
# of /proc (which goes by pid) reads the child before the parent. Both then sleep.
WRAPPED_DAEMON = """
import os, sys
def park():
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", {marker!r}])
if os.fork() == 0:
    os.setsid()
    for _ in range(400):
        child = os.fork()
        if child == 0:
            if os.getpid() < os.getppid():
                park()
            os._exit(0)
        if child < os.getpid():
            print("wrapped", flush=True)
            break
        os.waitpid(child, 0)
    park()
park()
"""


@pytest.mark.parametrize("mode", PROCESS)
def test_the_watchdog_kills_a_descendant_whose_pid_wrapped_around(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog kills the session leader; while it dies, its child is reparented to the watchdog
    after a scan of /proc already read it (lower pid, so earlier in the scan): the watchdog must not
    take that scan's word that no child is left. Without a dedicated uid to clean up after the call,
    the child would outlive it."""
    monkeypatch.setattr(sandbox, "_kill_uid", lambda uid: None)
    next_pid = Path("/proc/sys/kernel/ns_last_pid")
    if not os.access(next_pid, os.W_OK):
        pytest.skip("cannot choose the next pid here")
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    wrapped = 0
    for _ in range(3):  # other processes on the machine may take the pids up to the wrap first
        marker = f"hone-test-{uuid.uuid4().hex}"
        next_pid.write_text(str(pid_max - 100))
        result = run(WRAPPED_DAEMON.format(marker=marker), mode, timeout_s=2)
        left = live_with(marker)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert result.timed_out and left == [], result.stderr
        wrapped += result.stdout == "wrapped\n"
    assert wrapped > 0, "the pids never wrapped around inside the program"


@pytest.mark.parametrize("mode", PROCESS)
def test_a_call_never_kills_the_program_of_another_trainer_process(mode: str) -> None:
    """Slots are per process but uids are machine-wide: two trainer processes (torchrun ranks, xdist
    workers) running programs as one uid would kill each other's at cleanup (`kill -1` as that uid)."""
    marker = f"hone-test-{uuid.uuid4().hex}"
    sleeper = "import time; time.sleep(2); print('survived')"
    program = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {sleeper!r}, {marker!r}])"
    script = TRAINER.format(path=sandbox.__file__, program=program, mode=mode)
    other = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: live_with(marker) or other.poll() is not None, 30)
        limits = SandboxOptions(python=sandbox._interpreter(None, mode))
        ours = sandbox._run("print('ours')", "", limits, mode, 0)  # the other's first call has slot 0 too
        theirs = other.communicate(timeout=30)[0]
    finally:
        other.kill()
        other.wait()
    assert (ours.stdout, theirs) == ("ours\n", "survived\n")


_NOT_ROOT_BATTERY = r"""
import importlib.util, json, os, socket, sys, threading, time
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]
attacks = {
    "network": f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
    "    print('connected')\nexcept OSError as e:\n    print('refused', type(e).__name__)",
    "memory": "x = bytearray(4 << 30)\nprint('allocated')",
    "fork": "import os\nfor _ in range(100000):\n    try:\n        os.fork()\n"
    "    except OSError:\n        break\nprint('capped')",
    "survivor": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\n"
    "print('left one')",
}
out = {"namespaces": sandbox._namespaces_available()}
for name, code in attacks.items():
    started = time.monotonic()
    result = sandbox.run_python(code, timeout_s=5, isolation="process")
    out[name] = [result.stdout.strip()[:200], result.exit_code, round(time.monotonic() - started, 1)]
time.sleep(1)
mine = [p for p in os.listdir("/proc") if p.isdigit() and os.stat(f"/proc/{p}").st_uid == os.getuid()]
out["left_processes"] = len(mine) - 1  # this process
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to an unprivileged trainer needs root")
def test_a_trainer_that_is_not_root_isolates_the_network_where_the_kernel_allows_it(
    request: pytest.FixtureRequest,
) -> None:
    """Without bubblewrap and without root, the boot code enters an unprivileged user + network namespace:
    the host's loopback is out of reach, and the rest of the battery still holds."""
    nobody = 65534
    try:
        python = sandbox._shared_python()  # the trainer's own may sit under a private home
    except RuntimeError as e:
        pytest.skip(str(e))
    # Not under pytest's tmp_path: its parents are private to root. /tmp (1777) is reachable by others.
    work = Path(tempfile.mkdtemp(prefix="hone-nobody-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    os.chown(work, nobody, nobody)
    # The trainer's own copy of the sandbox, where `nobody` can read it (a clone may sit in a private dir).
    source = work / "sandbox.py"
    shutil.copyfile(sandbox.__file__, source)
    os.chmod(source, 0o644)
    if not all(os.stat(p).st_mode & stat.S_IXOTH for p in sandbox._ancestors(str(work))):
        pytest.skip(f"{work} is not reachable by other users here")
    done = subprocess.run(
        [python, "-I", "-c", _NOT_ROOT_BATTERY, str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
        env={"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work)},
        preexec_fn=lambda: (os.setgroups([]), os.setgid(nobody), os.setuid(nobody)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if not report["namespaces"]:
        assert "allows no network namespace" in done.stderr  # said once, clearly
        pytest.skip("unprivileged user namespaces are off here: the network is not isolated (said once)")
    assert report["network"][0].startswith("refused"), report
    assert report["memory"][0] != "allocated" and report["fork"][2] < 5 + MARGIN_S, report
    assert report["survivor"][2] < 5 + MARGIN_S and report["left_processes"] == 0, report

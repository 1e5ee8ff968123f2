"""The Ray executor (`cluster.backend: ray`) on a local Ray instance started by the run: the driver runs
the loop and the learner, the samplers and reward workers are actors. One sampler actor at η = 0 trains
exactly like the local run; two actors split every step into whole groups; a sampler actor or reward
worker killed mid-run is restarted, its work done again, and the run finishes; the run leaves no Ray
process behind.

Process checks count only the processes of the test's own Ray: every test gets a unique marker in its
environment, which Ray's daemons and workers inherit (`_ray_processes`), so another Ray instance on the
machine (another test run's, a user's) is never counted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from hone.rl.placement.source import merge_shares  # noqa: E402
from hone.rl.producer import PromptBatch, ScoredGroups  # noqa: E402
from hone.types import Rollout  # noqa: E402
from tests.helpers import TOKEN_REWARD, tiny_overrides  # noqa: E402
from tests.helpers import final_weights as _final_weights  # noqa: E402
from tests.helpers import train_tiny as _run  # noqa: E402

# One pytest-xdist worker runs them all (`--dist loadgroup`): two Ray instances of this suite at once would
# compete for the machine's cores (the process checks would not mix them up: see `_ray_processes`).
pytestmark = pytest.mark.xdist_group("ray")
# Per-node agents that outlive a raylet killed outright by ~40-60 s (measured), then exit on their own;
# the rest of a cluster whose driver was SIGKILLed goes within seconds, or tens of them on a loaded machine.
# The fault and cluster tests take ~2 minutes and time-sensitive waits: `make test-ray` runs them alone, after
# the suite (in CI too); beside the suite's other worker on 2 cores they were flaky.
RAY_CLUSTER = pytest.mark.ray_cluster
NODE_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]


MARKER = "HONE_TEST_RAY_OWNER"


@pytest.fixture(autouse=True)
def _own_ray(monkeypatch: pytest.MonkeyPatch) -> str:
    """A marker unique to this test in the environment every Ray process it starts inherits."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, token)
    return token


def _ray_processes() -> list[str]:
    """Command lines of this test's Ray daemons and workers (their environment holds its marker)."""
    mine = f"{MARKER}={os.environ[MARKER]}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if mine in environ and any(
            name in cmd for name in ("raylet", "gcs_server", "ray::", "default_worker")
        ):
            found.append(cmd)
    return found


def _wait_until(done: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Whether `done()` became true within `timeout_s` (checked every `interval_s`)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def test_one_sampler_actor_and_a_reward_worker_train_exactly_like_a_local_run_and_leave_no_ray_process(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    assert not ray.is_initialized()
    local = _final_weights(_run(tmp_path, micro_model_dir, "local"))
    run = _run(
        tmp_path,
        micro_model_dir,
        "ray",
        **{"cluster.backend": "ray", "cluster.samplers.num_cpus": 1, "cluster.reward_workers.count": 1},
    )
    remote = _final_weights(run)
    assert local.keys() == remote.keys() and all(torch.equal(local[k], remote[k]) for k in local)
    assert [r["faults/actor_restarts"] for r in _rows(run)] == [0.0, 0.0, 0.0]
    assert not ray.is_initialized()
    _assert_no_ray_processes_soon()


@RAY_CLUSTER
def test_two_sampler_actors_and_a_reward_worker_train_each_step_on_the_local_runs_prompts(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17's small cluster, at η = 0: every training rollout is scored in the reward worker's process,
    each step on exactly the local run's prompts (n rollouts each), sampled by the current weights. The
    final weights differ from the local run's, for a documented reason: each sampler actor draws its share
    with its own seed, so the step's samples are not the local run's draws (one actor: bit-identical,
    above)."""
    logs = {name: tmp_path / f"{name}.log" for name in ("local", "ray")}

    def scored(name: str, **extra: object) -> tuple[list[list[str]], set[int], Path]:
        monkeypatch.setenv("HONE_TEST_REWARD_LOG", str(logs[name]))
        reward = {"reward.fn": "tests.rewards_for_tests:token_id_reward_recorded"}
        run = _run(
            tmp_path, micro_model_dir, name, **{"run.steps": 4, "run.save_every": 4, **reward, **extra}
        )
        lines = [line.split() for line in logs[name].read_text().splitlines()]
        train = [(int(pid), sample) for pid, sample in lines if "-train-" in sample]
        per_step = len(train) // 4
        steps = [sorted(s for _, s in train[k * per_step : (k + 1) * per_step]) for k in range(4)]
        return steps, {pid for pid, _ in train}, run

    local, local_pids, _ = scored("local")
    ray_steps, ray_pids, run = scored(
        "ray",
        **{"cluster.backend": "ray", "cluster.samplers.count": 2, "cluster.reward_workers.count": 1},
    )
    assert ray_steps == local and all(len(step) == 4 * 4 for step in local)  # 4 prompts x 4 rollouts
    assert len(ray_pids) == 1 and ray_pids != local_pids  # one reward worker scored it all
    assert all(r["staleness/max"] == 0.0 and r["faults/actor_restarts"] == 0.0 for r in _rows(run))


@RAY_CLUSTER
def test_a_trl_reward_on_a_reward_worker_reads_the_step_and_its_logged_columns_come_back(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """TRL's contract through Ray: the reward worker's call sees the RL step as `trainer_state`, its
    `log_metric` lands in metrics.jsonl and its `log_extra` columns in samples.jsonl, as locally."""
    reward = {"reward.fn": "tests.trl_rewards_for_tests:trl_token_reward", "logging.samples": 2}
    local = _run(tmp_path, micro_model_dir, "local", **reward)
    run = _run(
        tmp_path,
        micro_model_dir,
        "ray",
        **{"cluster.backend": "ray", "cluster.samplers.num_cpus": 1, "cluster.reward_workers.count": 1},
        **reward,
    )
    assert [r["trl_test/step"] for r in _rows(run)] == [0.0, 1.0, 2.0]
    for key in ("rewards/trl_token_reward/mean", "rewards/trl_token_reward/std"):
        assert [r[key] for r in _rows(run)] == [r[key] for r in _rows(local)]
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert records and all(r["extra"]["parity"] in ("odd", "even") for r in records)
    _assert_no_ray_processes_soon()


@RAY_CLUSTER
def test_a_programs_own_reward_object_reaches_the_reward_worker(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """`hone.trl.GRPOTrainer`'s case: a reward that only the driver's program has (a closure, registered as
    `script:<name>`) is pickled to the Ray actors with their arguments and scores there as locally."""
    from hone.plugins import register_script_object

    weight = 0.5

    def closure_reward(completion_ids: list[list[int]], **kwargs: object) -> list[float]:
        return [weight * (sum(ids) % 3) for ids in completion_ids]

    spec = register_script_object("closure_reward", closure_reward)
    reward = {"reward.fn": spec, "reward.contract": "trl"}
    local = _run(tmp_path, micro_model_dir, "local", **reward)
    run = _run(
        tmp_path,
        micro_model_dir,
        "ray",
        **{"cluster.backend": "ray", "cluster.samplers.num_cpus": 1, "cluster.reward_workers.count": 1},
        **reward,
    )
    key = "rewards/closure_reward/mean"
    assert [r[key] for r in _rows(run)] == [r[key] for r in _rows(local)]


@RAY_CLUSTER
def test_a_trl_environment_on_a_reward_worker_is_scored_on_its_pickled_instances_as_locally(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """Issue 49: a TRL environment's instances travel with their rollouts to the reward worker, where its
    get_reward and a TRL reward reading `environments=` score them as a local run does; an instance that
    does not pickle stops the run in one line that names it and the way out."""
    rows = [
        {"prompt": [{"role": "user", "content": f"Go to {i % 5 + 1}."}], "target": i % 5 + 1}
        for i in range(40)
    ]
    data = tmp_path / "counter.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {
        "data.task": "null",
        "data.source": data,
        "env.name": "tests.trl_envs_for_tests:CounterEnv",
        "env.max_turns": 2,
        "reward.fn": "tests.trl_envs_for_tests:target_reward",
    }
    on_ray = {"cluster.backend": "ray", "cluster.samplers.num_cpus": 1, "cluster.reward_workers.count": 1}
    local = _run(tmp_path, micro_model_dir, "local", **env)
    run = _run(tmp_path, micro_model_dir, "ray", **on_ray, **env)
    for key in ("rewards/CounterEnv/mean", "rewards/target_reward/mean", "reward/mean"):
        assert [r[key] for r in _rows(run)] == [r[key] for r in _rows(local)]
    locked = {**env, "env.name": "tests.trl_envs_for_tests:LockedCounterEnv", "cluster.producer_retries": 0}
    with pytest.raises(Exception) as e:
        _run(tmp_path, micro_model_dir, "locked", **on_ray, **locked)
    assert "\n" not in str(e.value)
    assert "LockedCounterEnv does not pickle (cannot pickle '_thread.lock' object)" in str(e.value)
    assert "cluster.reward_workers.count: 0" in str(e.value)
    _assert_no_ray_processes_soon()


def test_shares_merge_into_one_step_in_prompt_order() -> None:
    def rollout(group: int) -> Rollout:
        return Rollout(
            sample_id=f"s{group}",
            group_id=group,
            token_ids=[0],
            prompt_len=1,
            loss_mask=[],
            sampler_logprobs=[],
        )

    shares = [PromptBatch(step=4, samples=[None] * 3, part=0), PromptBatch(step=4, samples=[None], part=1)]  # type: ignore[list-item]
    results = [
        ScoredGroups(
            step=4,
            rollouts=[rollout(0), rollout(2)],
            metrics={"reward/mean": 0.5, "time/sample_s": 2.0},
            new_tokens=5,
            outcomes={"a": (1, 2), "b": (0, 2)},
        ),
        ScoredGroups(
            step=4,
            rollouts=[rollout(0)],
            metrics={"reward/mean": 1.0, "time/sample_s": 3.0},
            new_tokens=2,
            outcomes={"a": (2, 2)},  # a prompt drawn twice in the step, once in each share
        ),
    ]
    merged = merge_shares(shares, results)
    assert [r.group_id for r in merged.rollouts] == [0, 2, 3]
    assert merged.metrics == {"reward/mean": 0.625, "time/sample_s": 3.0}
    assert merged.new_tokens == 7
    assert merged.outcomes == {"a": (3, 4), "b": (0, 2)}


def _pids_titled(title: str) -> list[int]:
    """This test's processes whose title (Ray sets `ray::<Actor class>[.<method>]`) starts with `title`."""
    mine = f"{MARKER}={os.environ[MARKER]}".encode()
    found = []
    for pid in os.listdir("/proc"):
        try:
            if (
                pid.isdigit()
                and Path(f"/proc/{pid}/cmdline").read_bytes().startswith(title.encode())
                and mine in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ):
                found.append(int(pid))
        except OSError:
            continue
    return found


@RAY_CLUSTER
@pytest.mark.parametrize(
    ("role", "settings"),
    [
        ("ray::SamplerActor", {"cluster.samplers.count": 2}),
        ("ray::RewardActor", {"cluster.reward_workers.count": 1}),
    ],
)
def test_an_actor_killed_mid_call_is_restarted_and_the_run_finishes(
    tmp_path: Path,
    micro_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    role: str,
    settings: dict[str, object],
) -> None:
    """A sampler actor (scoring its rollouts) or a reward worker SIGKILLs its own process in its 20th
    reward call, mid-step 2 or 3: Ray restarts it, the share is produced (or the rollouts scored) again
    with the current weights, every step is trained once and the restart is counted once."""
    marker = tmp_path / "died"
    monkeypatch.setenv("HONE_TEST_DIE_IN", role)
    monkeypatch.setenv("HONE_TEST_DIE_MARKER", str(marker))
    extra = {"reward.fn": "tests.rewards_for_tests:token_id_reward_dying_once", "cluster.backend": "ray"}
    run = _run(
        tmp_path, micro_model_dir, "killed", **{"run.steps": 5, "run.save_every": 5, **extra, **settings}
    )
    rows = _rows(run)
    assert marker.exists() and [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert sum(r["faults/actor_restarts"] for r in rows) == 1.0
    assert all(r["staleness/max"] == 0.0 for r in rows)  # the restarted actor got the current weights
    _assert_no_ray_processes_soon()


def test_a_request_the_cluster_cannot_place_is_one_line(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hone.cli import main

    args = tiny_overrides(tmp_path, micro_model_dir, "nogpu", **TOKEN_REWARD)
    # The driver builds the run first (not timed); the timeout is only the wait for a placement that never
    # comes, so it can be short.
    extra = ["cluster.backend=ray", "cluster.samplers.num_gpus=1", "cluster.start_timeout_s=5"]
    assert main(["train", *args, *extra]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hone: error: the Ray cluster cannot place 1 sampler actor(s) of {'CPU': 1")
    assert "'GPU': 1" in last and "(cluster.start_timeout_s); available: {" in last
    _assert_no_ray_processes_soon()


def test_an_address_with_no_cluster_is_one_line_at_once(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ray.init` would retry an address where nothing listens for minutes."""
    from hone.cli import main

    args = tiny_overrides(tmp_path, micro_model_dir, "nocluster", **TOKEN_REWARD)
    started = time.monotonic()
    assert main(["train", *args, "cluster.backend=ray", "cluster.address=127.0.0.1:1"]) == 2
    assert time.monotonic() - started < 15
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hone: error: cannot attach to the Ray cluster at 127.0.0.1:1 (cluster.address")
    assert not ray.is_initialized() and not (tmp_path / "nocluster").exists()


@RAY_CLUSTER
def test_sigkill_and_resume_on_ray_logs_every_step_once_and_trains_like_a_straight_run(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """As locally (`_killed_and_resumed`): the driver SIGKILLed between checkpoints 4 and 8, resumed with
    a plain `--resume`; rows 0..8 once each, and at η = 0 the same final weights as an unbroken Ray run.
    Killing the driver that started Ray must not leave Ray's processes behind."""
    from tests.helpers import assert_same_weights as _assert_same_weights
    from tests.helpers import killed_and_resumed as _killed_and_resumed

    straight, resumed = _killed_and_resumed(tmp_path, micro_model_dir, **{"cluster.backend": "ray"})
    _assert_same_weights(straight, resumed)
    # Ray's daemons and workers die with the SIGKILLed driver that started them; its per-node agents
    # (dashboard, runtime env) notice the raylet is gone only after ~40-60 s (measured) and exit then.
    _assert_no_ray_processes_soon(timeout_s=90, ignore=NODE_AGENTS)


def _assert_no_ray_processes_soon(timeout_s: float = 20.0, ignore: tuple[str, ...] = ()) -> None:
    def left() -> list[str]:
        return [cmd for cmd in _ray_processes() if not any(name in cmd for name in ignore)]

    _wait_until(lambda: not left(), timeout_s, interval_s=0.2)
    assert left() == []


@RAY_CLUSTER
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_on_ray_is_one_line_within_seconds_and_leaves_no_ray_process(
    tmp_path: Path, micro_model_dir: Path, sig: signal.Signals
) -> None:
    from tests.helpers import run_cli as _run_cli

    settings = {"run.steps": 200, "run.eval_every": 0, "cluster.backend": "ray", **TOKEN_REWARD}
    run = _run_cli(tiny_overrides(tmp_path, micro_model_dir, "interrupted", **settings), tmp_path)
    metrics = tmp_path / "interrupted" / "metrics.jsonl"
    reached = _wait_until(
        lambda: run.poll() is not None or (metrics.exists() and '"step": 2' in metrics.read_text()), 120
    )
    assert reached and run.poll() is None, "the run never reached step 2"
    run.send_signal(sig)
    sent = time.monotonic()
    _, err = run.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert run.returncode == 128 + sig
    assert err.decode().strip().splitlines()[-1].startswith("hone: interrupted at step ")
    _assert_no_ray_processes_soon()


@RAY_CLUSTER
def test_two_nodes_samplers_on_one_reward_worker_on_the_other(tmp_path: Path, micro_model_dir: Path) -> None:
    """A two-node rehearsal on one machine (two raylets, as `ray start --head` plus `ray start --address`):
    the head has the custom resource `node_a`, node B `node_b`; the recipe asks `node_b` of the samplers and
    `node_a` of the reward worker, so each runs as a worker of that node's raylet (the driver, this process,
    runs the learner). The attached run kills its actors and leaves the cluster up; the cluster's shutdown
    leaves no process."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}})
    titles = ("ray::SamplerActor", "ray::RewardActor")
    try:
        node_b = cluster.add_node(num_cpus=1, resources={"node_b": 1})
        raylet = {
            name: node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
            for name, node in (("a", cluster.head_node), ("b", node_b))
        }
        parents: dict[str, set[int]] = {title: set() for title in titles}
        running = threading.Event()
        running.set()

        def watch() -> None:
            while running.is_set():
                for title, seen in parents.items():
                    for pid in _pids_titled(title):
                        with contextlib.suppress(OSError, IndexError):
                            seen.add(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]))
                running.wait(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        settings = {
            "cluster.backend": "ray",
            "cluster.address": cluster.address,
            "cluster.samplers.count": 1,
            "cluster.samplers.resources": '{"node_b": 1}',
            "cluster.reward_workers.count": 1,
            "cluster.reward_workers.resources": '{"node_a": 1}',
        }
        try:
            run = _run(tmp_path, micro_model_dir, "two-nodes", **settings)
        finally:
            running.clear()
            watcher.join(timeout=10)
        assert [r["step"] for r in _rows(run)] == [1, 2, 3]
        assert parents == {"ray::SamplerActor": {raylet["b"]}, "ray::RewardActor": {raylet["a"]}}
        assert ray.is_initialized()  # attached: the run did not shut the cluster down
        # The run killed its actors; their processes exit soon after.
        assert _wait_until(lambda: not any(_pids_titled(title) for title in titles), 20, interval_s=0.1)
    finally:
        ray.shutdown()
        cluster.shutdown()
    # `Cluster.shutdown` kills the raylets outright, so the node agents exit late, as after a SIGKILL.
    _assert_no_ray_processes_soon(timeout_s=90, ignore=NODE_AGENTS)


def test_a_reward_worker_builds_the_task_without_drawing_the_training_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`load_task` resolves the task a reward grades against as `load_data` does, but draws no samples."""
    from hone.config import DataConfig
    from hone.data.splits import load_task
    from hone.data.tasks import Task

    def no_samples(*args: object, **kwargs: object) -> None:
        raise AssertionError("a reward worker drew training samples")

    monkeypatch.setattr(Task, "train_samples", no_samples)
    assert isinstance(load_task(DataConfig(task="arithmetic")), Task)
    assert load_task(DataConfig(task=None, source="rows.jsonl")) is None


@RAY_CLUSTER
def test_a_two_rank_learner_group_on_ray_trains_as_the_local_two_ranks_and_leaves_no_ray_process(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """`trainer.world_size: 2` on Ray: the driver is rank 0, rank 1 an actor of the learner group; at η = 0
    (one sampler actor) the run ends on the local 2-rank run's weights, bit for bit."""
    ranks = {"trainer.world_size": 2, "trainer.collective_timeout_s": 60}
    settings = {"run.steps": 3, "run.save_every": 3, "run.eval_every": 0, **TOKEN_REWARD, **ranks}
    local = subprocess.run(
        [
            sys.executable,
            "-m",
            "hone.cli",
            "train",
            *tiny_overrides(tmp_path, micro_model_dir, "local", **settings),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert local.returncode == 0, local.stderr[-3000:]
    on_ray = {"cluster.backend": "ray", "cluster.samplers.num_cpus": 1, **ranks}
    run = _run(tmp_path, micro_model_dir, "ray", **on_ray)
    expected, got = _final_weights(tmp_path / "local"), _final_weights(run)
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    assert not ray.is_initialized()
    _assert_no_ray_processes_soon()


def test_a_sampler_actor_builds_its_producer_as_the_driver_does_and_samples_the_same(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """In process (no cluster): a sampler actor's producer, built by `build_producer_parts` over the one
    model it loads, produces a step exactly as the driver's producer over its own sampler copy."""
    from hone.config import load_config
    from hone.rl.components import build_components, close_samplers
    from hone.rl.placement.ray.actors import SamplerActor
    from hone.rl.producer import Producer, ProducerSettings

    cfg = load_config(None, tiny_overrides(tmp_path, micro_model_dir, "actor", **TOKEN_REWARD))
    actor = SamplerActor(cfg.model_dump(mode="json"), os.getcwd(), torch.get_num_threads(), {}, [])
    parts = build_components(cfg)
    try:
        assert type(actor.producer.parts) is type(parts.producer)
        prompts = PromptBatch(step=0, samples=parts.train_samples[:4])
        theirs = actor.produce(prompts, retries=0)
        ours = Producer(parts.producer, ProducerSettings.of(cfg)).produce(prompts)
        assert ours.rollouts
        assert [r.token_ids for r in theirs.rollouts] == [r.token_ids for r in ours.rollouts]
        assert [r.reward for r in theirs.rollouts] == [r.reward for r in ours.rollouts]
    finally:
        actor.close()
        close_samplers(parts)

"""The Ray back-end (`cluster.backend: ray`) on a local Ray instance started by the run: one sampler actor
at η = 0 trains exactly like the local run; two actors split every step into whole groups; a sampler
actor killed mid-run is restarted, its share produced again, and the run finishes; the run leaves no
Ray process behind."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from hone.config import load_config  # noqa: E402
from hone.orchestration import ray_backend  # noqa: E402
from hone.orchestration.loop import train  # noqa: E402
from hone.orchestration.producer import PromptBatch, ScoredGroups  # noqa: E402
from hone.types import Rollout  # noqa: E402
from tests.test_orchestration import tiny_overrides  # noqa: E402
from tests.test_weights import _final_weights  # noqa: E402

TOKEN_REWARD = {"reward.fn": "tests.rewards_for_tests:token_id_reward"}
# One pytest-xdist worker runs them all (`--dist loadgroup`): two Ray instances at once would see each
# other's processes in the process-table checks.
pytestmark = pytest.mark.xdist_group("ray")


def _run(tmp_path: Path, model_dir: Path, name: str, **extra: object) -> Path:
    settings = {"run.steps": 3, "run.save_every": 3, "run.eval_every": 0, **TOKEN_REWARD, **extra}
    train(load_config(None, tiny_overrides(tmp_path, model_dir, name, **settings)))
    return tmp_path / name


def _rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]


def _ray_processes() -> list[str]:
    """Command lines of Ray's daemons and workers on this machine."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(name in cmd for name in ("raylet", "gcs_server", "ray::", "default_worker.py")):
            found.append(cmd)
    return found


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
    assert _ray_processes() == []


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
        ),
        ScoredGroups(
            step=4, rollouts=[rollout(0)], metrics={"reward/mean": 1.0, "time/sample_s": 3.0}, new_tokens=2
        ),
    ]
    merged = ray_backend.merge_shares(shares, results)
    assert [r.group_id for r in merged.rollouts] == [0, 2, 3]
    assert merged.metrics == {"reward/mean": 0.625, "time/sample_s": 3.0}
    assert merged.new_tokens == 7


def test_a_killed_sampler_actor_is_restarted_and_the_run_finishes(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sampler actors; right after step 3 is submitted, actor 1's process is killed with SIGKILL:
    Ray restarts it, its share is produced again with the current weights, the run trains every step."""
    real_submit = ray_backend.RayRollouts.submit
    killed: list[int] = []

    def submit(self: ray_backend.RayRollouts, prompts: PromptBatch) -> None:
        real_submit(self, prompts)
        if prompts.step == 2 and not killed:
            pid = self.actor_pids()[1]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    monkeypatch.setattr(ray_backend.RayRollouts, "submit", submit)
    run = _run(
        tmp_path,
        micro_model_dir,
        "killed",
        **{
            "run.steps": 4,
            "run.save_every": 4,
            "cluster.backend": "ray",
            "cluster.samplers.count": 2,
            "cluster.samplers.num_cpus": 1,
        },
    )
    rows = _rows(run)
    assert killed and [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["faults/actor_restarts"] for r in rows) == 1.0
    # Counted on the step whose share found the actor dead (step 3's, or step 4's if step 3's share was
    # done before the kill landed).
    assert [r["faults/actor_restarts"] for r in rows[:2]] == [0.0, 0.0]
    assert all(r["staleness/max"] == 0.0 for r in rows)  # the restarted actor got the current weights
    assert _ray_processes() == []


def test_a_request_the_cluster_cannot_place_is_one_line(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hone.cli import main

    args = tiny_overrides(tmp_path, micro_model_dir, "nogpu", **TOKEN_REWARD)
    extra = ["cluster.backend=ray", "cluster.samplers.num_gpus=1", "cluster.start_timeout_s=3"]
    assert main(["train", *args, *extra]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hone: error: the Ray cluster cannot place 1 sampler actor(s) of {'CPU': 1")
    assert "'GPU': 1" in last and "(cluster.start_timeout_s); available: {" in last
    assert _ray_processes() == []

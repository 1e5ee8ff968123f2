"""Asynchronous mode (`cluster.mode: async`): η = 0 is synchronous training exactly, no trained rollout
is more than η versions old, its metrics; faults: a producer error is retried (then stops the run in one
line, never a hang), a wedged publish times out in one line, Ctrl-C ends the run within seconds, and a
resume restores the version counter and produces the steps in flight again."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hone.config import load_config
from hone.rewards.scoring import ScoringRound
from hone.rl.learner import Learner
from hone.rl.loop import train
from hone.rl.placement.executors import ThreadExecutor
from hone.rl.placement.source import Rollouts
from hone.rl.placement.weights import LocalWeightChannel
from hone.rl.producer import Producer, PromptBatch, ScoredGroups, sampling_params
from hone.training.checkpoint import Checkpointer
from hone.types import Rollout, Sample
from tests.helpers import TOKEN_REWARD, final_weights, recording_setup, tiny_overrides, train_tiny


@pytest.mark.parametrize("producers", [1, 2])
def test_async_with_no_staleness_trains_exactly_like_sync(
    tmp_path: Path, micro_model_dir: Path, producers: int
) -> None:
    """One producer: bit for bit the synchronous run. Two split every step into two shares, each on its
    own sampler (its own copy of the weights) and seeded apart, so their draws differ from one
    producer's; every publish must reach both, or one would sample with version 0's weights (staleness)."""
    sync = final_weights(train_tiny(tmp_path, micro_model_dir, "sync"))
    run = train_tiny(
        tmp_path,
        micro_model_dir,
        "async",
        **{"cluster.mode": "async", "cluster.max_staleness": 0, "cluster.producers": producers},
    )
    if producers == 1:
        same = final_weights(run)
        assert sync.keys() == same.keys() and all(torch.equal(sync[k], same[k]) for k in sync)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["staleness/max"] == 0.0 for r in rows)
    assert not _producer_threads()  # the run closed it


@pytest.mark.parametrize(("eta", "producers"), [(1, 1), (2, 1), (2, 2)])
def test_no_trained_rollout_is_more_than_eta_versions_old(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch, eta: int, producers: int
) -> None:
    """A slow learner (0.3 s a step) lets the producers run as far ahead as admission allows: every
    rollout a step trains on was sampled by a version at most η behind the learner's, and some by an older
    one than the learner's (the producers did run ahead). The logged staleness says the same. With two
    producers (each its own sampler) steps still reach the learner in order."""
    seen: list[tuple[int, int, int]] = []  # (learner version, oldest rollout version, newest)
    steps: list[int] = []
    real_learn = Learner.learn

    def slow_learn(self: Learner, groups: ScoredGroups, step: int) -> dict[str, Any]:
        time.sleep(0.3)
        versions = [r.policy_version for r in groups.rollouts]
        seen.append((loop_parts[0].weights.published, min(versions), max(versions)))
        steps.append(groups.step)
        return real_learn(self, groups, step)

    setup, loop_parts = recording_setup()
    monkeypatch.setattr(Learner, "learn", slow_learn)
    run = train_tiny(
        tmp_path,
        micro_model_dir,
        "ahead",
        setup,
        **{
            "run.steps": 6,
            "run.save_every": 6,
            "cluster.mode": "async",
            "cluster.max_staleness": eta,
            "cluster.producers": producers,
        },
    )
    assert [v for v, _, _ in seen] == list(range(6))  # every step trained and published once
    assert steps == list(range(6))
    assert all(learner - oldest <= eta for learner, oldest, _ in seen)
    assert any(learner - newest > 0 for learner, _, newest in seen)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]
    assert [r["staleness/max"] for r in rows] == [float(v - o) for v, o, _ in seen]
    for row in rows:
        assert row.keys() >= {
            "staleness/mean",
            "buffer/groups",
            "time/learner_idle_frac",
            "time/producer_idle_frac",
        }
        assert 0 <= row["time/learner_idle_frac"] <= 1 and 0 <= row["time/producer_idle_frac"] <= 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_producer_fault_that_passes_is_retried_and_the_run_trains_as_if_it_never_happened(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Step 3's scoring fails once, after its sampling ran: the step is produced again (same prompts,
    seed and weights), counted in `faults/producer_retries`, and the run ends on the weights of a run
    without the fault (async with η = 0 is synchronous training exactly)."""
    clean = final_weights(train_tiny(tmp_path, micro_model_dir, "clean"))
    real_finish = ScoringRound.finish
    calls: list[int] = []

    async def flaky_finish(self: ScoringRound, *args: Any) -> dict[str, float]:
        calls.append(len(calls))
        if len(calls) == 3:  # steps 0 and 1 scored; step 2's first attempt fails
            raise ConnectionError("judge returned HTTP 502")
        return await real_finish(self, *args)

    monkeypatch.setattr(ScoringRound, "finish", flaky_finish)
    run = train_tiny(tmp_path, micro_model_dir, "flaky", **{"cluster.mode": mode, "cluster.max_staleness": 0})
    assert len(calls) == 4
    faulty = final_weights(run)
    assert clean.keys() == faulty.keys() and all(torch.equal(clean[k], faulty[k]) for k in clean)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]
    assert [r["faults/producer_retries"] for r in rows] == [0.0, 0.0, 1.0]
    assert not _producer_threads()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_producer_that_keeps_failing_stops_the_run_in_one_line_after_its_retries(
    tmp_path: Path,
    micro_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    mode: str,
) -> None:
    from hone.cli import main
    from tests.helpers import tiny_run

    real_produce = Producer.produce
    attempts: list[int] = []

    def failing(self: Producer, prompts: PromptBatch) -> ScoredGroups:
        attempts.append(prompts.step)
        if prompts.step == 2:
            raise ConnectionError("judge returned HTTP 502\n<html>Bad Gateway</html>")
        return real_produce(self, prompts)

    monkeypatch.setattr(Producer, "produce", failing)
    args = tiny_run(tmp_path, micro_model_dir, **{"run.steps": 5, "cluster.mode": mode})
    started = time.perf_counter()
    assert main(["train", *args, "cluster.max_staleness=2", "cluster.producer_retries=2"]) == 2
    assert time.perf_counter() - started < 60
    assert attempts.count(2) == 3  # the first attempt and two retries
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "hone: error: stopped at RL step 3: producing its rollouts failed on 3 attempts "
        "(cluster.producer_retries=2); last error: ConnectionError: judge returned HTTP 502 "
        "<html>Bad Gateway</html>"
    )
    steps = [json.loads(x)["step"] for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]  # the steps before it trained and logged
    assert not _producer_threads()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_system_exit_in_the_producer_is_not_retried(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    attempts: list[int] = []

    def exiting(self: Producer, prompts: PromptBatch) -> ScoredGroups:
        attempts.append(prompts.step)
        raise SystemExit(3)

    monkeypatch.setattr(Producer, "produce", exiting)
    with pytest.raises(SystemExit):
        train_tiny(tmp_path, micro_model_dir, "exits", **{"cluster.mode": mode, "cluster.max_staleness": 0})
    assert attempts == [0]
    assert not _producer_threads()


def test_a_publish_the_producer_blocks_past_its_timeout_ends_the_run_in_one_line(
    tmp_path: Path,
    micro_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The producer holds the sampler's weights for 3 s on step 2 (a wedged generation): the learner's
    publish after step 1 waits `cluster.publish_timeout_s` (0.2 s), and the CLI prints one line."""
    from hone.cli import main
    from tests.helpers import tiny_run

    real_produce = Producer.produce

    def wedged(self: Producer, prompts: PromptBatch) -> ScoredGroups:
        if prompts.step == 1:
            time.sleep(3)
        return real_produce(self, prompts)

    monkeypatch.setattr(Producer, "produce", wedged)
    settings = {"run.steps": 4, "cluster.mode": "async", "algorithm.skip_zero_variance_groups": "false"}
    args = tiny_run(tmp_path, micro_model_dir, **settings, **TOKEN_REWARD)  # step 1 trains and publishes
    assert main(["train", *args, "cluster.max_staleness=1", "cluster.publish_timeout_s=0.2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "hone: error: weight publish of version 1 did not complete within 0.2 s: the sampler (at "
        "version 0) never left its generation to take it (cluster.publish_timeout_s)"
    )
    assert not _producer_threads()


def _producer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hone-producer") and t.is_alive()]


def test_ctrl_c_in_async_mode_is_one_line_and_leaves_no_producer_thread(
    tmp_path: Path,
    micro_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hone.cli import main
    from tests.helpers import tiny_run

    callbacks = '["tests.test_cli:interrupt_after_step_2"]'
    args = tiny_run(
        tmp_path, micro_model_dir, **{"run.steps": 6, "cluster.mode": "async", "run.callbacks": callbacks}
    )
    assert main(["train", *args, "cluster.max_staleness=2"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("hone: interrupted at step 2;")
    assert not _producer_threads()


def test_sigkill_and_resume_in_async_mode_logs_every_step_once(tmp_path: Path, micro_model_dir: Path) -> None:
    """The checkpoint holds the version counter beside the step; steps that were buffered or in flight at the
    kill are submitted again on resume, from the same prompts and seeds, so no row is lost or repeated
    (`killed_and_resumed` checks rows 0..8 and that the resumed steps trained)."""
    from tests.helpers import killed_and_resumed

    killed_and_resumed(tmp_path, micro_model_dir, **{"cluster.mode": "async", "cluster.max_staleness": 2})


class _Killed(BaseException):
    """A stand-in for SIGKILL that a test can raise at a chosen step (nothing in the run catches it)."""


def test_resume_restores_the_version_counter_and_regenerates_the_steps_in_flight(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """η = 2 and a slow learner, so steps run ahead of training; step 2's groups are all filtered out, so
    it publishes nothing and the version (publishes) falls one behind the step. A run killed at RL step 7
    (steps 7 and 8 produced or in flight, checkpoint 4 the last) and resumed: the checkpoint holds version
    3, the resumed sampler starts at it, steps 5-8 are produced again with the prompts and seeds of a
    run never stopped, every step is logged once, staleness never exceeds η (versions counted as steps
    would report η + 1 on RL step 5, sampled before RL step 3 published), and both runs end at version 7."""
    eta = 2
    produced: list[tuple[int, int, tuple[str, ...], int | None]] = []  # step, version, prompts, seed
    real_produce, real_learn = Producer.produce, Learner.learn

    def recording_produce(self: Producer, prompts: PromptBatch) -> ScoredGroups:
        seed = sampling_params(self.settings.rollout, self.settings.seed, prompts.step).seed
        ids = tuple(s.id for s in prompts.samples)
        produced.append((prompts.step, self.parts.sampler.policy_version, ids, seed))
        groups = real_produce(self, prompts)
        if prompts.step == 1:
            groups.rollouts = []  # every group filtered out: the step trains nothing
        return groups

    def slow_learn(self: Learner, groups: ScoredGroups, step: int) -> dict[str, Any]:
        time.sleep(0.3)
        return real_learn(self, groups, step)

    def killed_at_step_7(step: int, metrics: Any) -> None:
        if step == 6:  # steps 1-6 done: killed before step 7 trains
            raise _Killed

    setup, built = recording_setup()
    monkeypatch.setattr(Producer, "produce", recording_produce)
    monkeypatch.setattr(Learner, "learn", slow_learn)
    settings = {
        "run.steps": 8,
        "run.save_every": 4,
        "run.eval_every": 0,
        "cluster.mode": "async",
        "cluster.max_staleness": eta,
        **TOKEN_REWARD,
    }
    train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "straight", **settings)), setup=setup)
    straight = {step: (ids, seed) for step, _, ids, seed in produced}
    assert built[-1].weights.version == 7  # 8 steps, one of which published nothing
    rows = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= r["staleness/max"] <= eta for r in rows[1:])

    produced.clear()
    killed_cfg = tiny_overrides(tmp_path, micro_model_dir, "killed", **settings)
    with pytest.raises(_Killed):
        train(load_config(None, killed_cfg), callbacks=[killed_at_step_7], setup=setup)
    run = tmp_path / "killed"
    assert 6 in [step for step, *_ in produced]  # produced before the kill, never trained
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-")) == ["step-4"]
    saved = json.loads((run / "checkpoints" / "step-4" / "state.json").read_text())
    assert (saved["step"], saved["version"]) == (4, 3)

    produced.clear()
    train(load_config(None, killed_cfg), resume=True, setup=setup)
    assert [step for step, *_ in produced] == [4, 5, 6, 7]  # the steps after checkpoint 4, once each
    assert produced[0][1] == 3  # the sampler starts at the checkpoint's version
    assert all(straight[step] == (ids, seed) for step, _, ids, seed in produced)
    assert built[-1].weights.version == 7
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(9))
    assert all(0 <= r["staleness/max"] <= eta for r in rows[1:])


def test_sigint_ends_an_async_run_within_seconds_with_its_last_checkpoint_intact(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """A real Ctrl-C (SIGINT to the process) while the producer is busy scoring (0.2 s a rollout) and
    running ahead: the process exits within 10 s with the one interrupted line, and its last checkpoint
    resumes."""
    from hone.cli import main
    from tests.helpers import REPO, tiny_run

    args = tiny_run(
        tmp_path,
        micro_model_dir,
        **{
            "run.steps": 10_000,
            "run.save_every": 1,
            "cluster.mode": "async",
            "cluster.max_staleness": 2,
            "reward.fn": "tests.rewards_for_tests:slow_token_id_reward",
        },
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "hone.cli", "train", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        metrics = tmp_path / "r" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and '"step": 2' in metrics.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the run never reached step 2"
            time.sleep(0.05)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - signalled < 10, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, err
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(r"hone: interrupted at step (\d+); last checkpoint step (\d+); resume with .*", last)
    assert match and "Traceback" not in err, err
    logged, saved = int(match[1]), int(match[2])
    assert saved in (logged - 1, logged)  # interrupted after the step's row, perhaps before its save
    run = tmp_path / "r"
    assert Checkpointer(run).latest_intact() == run / "checkpoints" / f"step-{saved}"
    assert main(["train", "--resume", str(run), f"run.steps={saved + 1}"]) == 0
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(saved + 2))


class _Sampler:
    """A sampler that is only a weight version (the channel's other end)."""

    policy_version = 0

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        self.policy_version = version


GATE_S = 60  # how long a gated step waits for what the test lets happen: a hang, not a slow machine


class _GatedProducer:
    """Produces step s once `gates[s]()` returns (none: at once), stamping its rollouts with the version it
    held when the step started: the test decides when a step is in flight and when it ends."""

    def __init__(self, weights: Any, gates: dict[int, Callable[[], object]]) -> None:
        self.weights, self.gates = weights, gates

    def interrupt(self) -> None:
        pass  # a gate is not interruptible; close waits for it

    def produce(self, prompts: PromptBatch) -> ScoredGroups:
        version = self.weights.version
        self.gates.get(prompts.step, lambda: None)()
        rollout = Rollout(
            sample_id="s",
            group_id=0,
            token_ids=[0],
            prompt_len=1,
            loss_mask=[],
            sampler_logprobs=[],
            policy_version=version,
        )
        return ScoredGroups(step=prompts.step, rollouts=[rollout], metrics={}, new_tokens=0)


def _workers(gates: dict[int, Callable[[], object]], count: int) -> list[tuple[Any, Any]]:
    workers = []
    for _ in range(count):
        weights = LocalWeightChannel(dict, _Sampler(), timeout_s=5)  # type: ignore[arg-type]
        workers.append((_GatedProducer(weights, gates), weights))
    return workers


class _Plan:
    """`prompts` prompts a step, nothing learnt from outcomes."""

    def __init__(self, prompts: int) -> None:
        self.prompts = prompts

    def batch(self, step: int) -> list[Sample]:
        return [Sample(id=f"{step}-{k}", prompt="p") for k in range(self.prompts)]

    def observe(self, step: int, outcomes: Any) -> dict[str, float]:
        return {}


def _source(workers: list[tuple[Any, Any]], *, ahead: int, steps: int) -> Rollouts:
    return Rollouts(
        ThreadExecutor(workers), _Plan(len(workers)), start=0, steps=steps, ahead=ahead, version=0
    )


def test_a_publish_does_not_wait_for_the_producers_step_and_lands_as_its_next_step_starts() -> None:
    """The producer is inside step 1 when the learner publishes version 1: the publish returns while the
    step is still held (the learner trains on), step 1 keeps the version it started with, step 2 starts
    with version 1."""
    inside, release, ended = threading.Event(), threading.Event(), threading.Event()

    def step_1() -> None:
        inside.set()
        release.wait(GATE_S)
        ended.set()

    workers = _workers({1: step_1}, 1)
    ((_, weights),) = workers
    source = _source(workers, ahead=1, steps=3)
    try:
        assert source.take().rollouts[0].policy_version == 0  # step 1 admitted with it
        assert inside.wait(GATE_S), "the producer never started step 1"
        source.publish(1)  # a publish that waited for step 1 would return only when its gate times out
        assert not ended.is_set()  # the publish returned with step 1 still in flight
        assert (weights.version, weights.published) == (0, 1)
        release.set()
        one, two = source.take(), source.take()
        assert (one.rollouts[0].policy_version, one.metrics["staleness/max"]) == (0, 1.0)
        assert (two.rollouts[0].policy_version, two.metrics["staleness/max"]) == (1, 0.0)
    finally:
        release.set()
        source.close()
    assert not _producer_threads()


def test_two_producers_produce_a_steps_two_shares_side_by_side_and_merge_them_in_prompt_order() -> None:
    """Each producer's share of step 0 waits for the other's to start: the step is done only if both are
    in flight together (one after the other, the barrier breaks), its groups are the shares' in prompt
    order, and a publish reaches both producers."""
    together = threading.Barrier(2, timeout=GATE_S)
    workers = _workers({0: together.wait}, 2)
    source = _source(workers, ahead=0, steps=2)
    try:
        first = source.take()
        assert first.step == 0 and [r.group_id for r in first.rollouts] == [0, 1]
        source.publish(1)
        assert [w.published for _, w in workers] == [1, 1]
        assert {r.policy_version for r in source.take().rollouts} == {1}
    finally:
        source.close()
    assert not _producer_threads()


def test_whole_steps_go_to_the_producers_in_turn_and_two_slow_steps_overlap() -> None:
    """`cluster.producer_split: steps`: steps 0 and 1 go to producers 0 and 1 and are sampled at once
    (η = 1: each waits for the other to start, or the barrier breaks), each whole (all its prompts in one
    share); they are taken in step order."""
    together = threading.Barrier(2, timeout=GATE_S)
    workers = _workers({0: together.wait, 1: together.wait}, 2)
    source = Rollouts(
        ThreadExecutor(workers), _Plan(3), start=0, steps=3, ahead=1, version=0, whole_steps=True
    )
    try:
        first, second = source.take(), source.take()
        assert (first.step, second.step) == (0, 1)
        assert len(first.rollouts) == len(second.rollouts) == 1  # one producer's whole step each
    finally:
        source.close()
    assert not _producer_threads()


class _RecordingExecutor:
    """An executor that produces at once, recording which step was submitted before which take."""

    inline = False
    width = 1

    def __init__(self) -> None:
        self.events: list[str] = []

    def submit(self, k: int, prompts: PromptBatch) -> Any:
        self.events.append(f"submit {prompts.step}")
        events = self.events

        class Done:
            def result(self) -> ScoredGroups:
                events.append(f"take {prompts.step}")
                return ScoredGroups(step=prompts.step, rollouts=[], metrics={}, new_tokens=0)

            def peek(self) -> ScoredGroups | None:
                return None

        return Done()

    def publish(self, version: int) -> None:
        pass

    def idle_s(self) -> float | None:
        return None

    def close(self) -> None:
        pass


@pytest.mark.parametrize("eta", [0, 2])
def test_admission_submits_step_s_once_s_minus_eta_steps_are_taken_and_never_past_the_last(eta: int) -> None:
    """AReaL's rule counted in steps, owned by the source: before the take of step t every step up to
    t + η is submitted, none beyond the run's last; a resumed source starts at its checkpoint's step."""
    executor = _RecordingExecutor()
    source = Rollouts(executor, _Plan(1), start=1, steps=5, ahead=eta, version=0)
    assert [source.take().step for _ in range(4)] == [1, 2, 3, 4]
    expected = []
    submitted = 1
    for t in range(1, 5):
        while submitted <= min(t + eta, 4):
            expected.append(f"submit {submitted}")
            submitted += 1
        expected.append(f"take {t}")
    assert executor.events == expected
    with pytest.raises(RuntimeError, match="past the run's last step"):
        source.take()

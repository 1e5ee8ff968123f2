"""Asynchronous mode (`trainer.mode: async`): η = 0 is synchronous training exactly, no trained rollout
is more than η versions old, its metrics, and a producer that fails ends the run instead of hanging."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hone.config import load_config
from hone.orchestration import loop
from hone.orchestration.learner import Learner
from hone.orchestration.loop import train
from hone.orchestration.producer import Producer, PromptBatch, ScoredGroups
from tests.test_orchestration import tiny_overrides
from tests.test_weights import _final_weights

TOKEN_REWARD = {"reward.fn": "tests.rewards_for_tests:token_id_reward"}  # a gradient at every step


def _run(tmp_path: Path, model_dir: Path, name: str, **extra: object) -> Path:
    settings = {"run.steps": 3, "run.save_every": 3, "run.eval_every": 0, **TOKEN_REWARD, **extra}
    train(load_config(None, tiny_overrides(tmp_path, model_dir, name, **settings)))
    return tmp_path / name


def test_async_with_no_staleness_trains_exactly_like_sync(tmp_path: Path, micro_model_dir: Path) -> None:
    sync = _final_weights(_run(tmp_path, micro_model_dir, "sync"))
    run = _run(tmp_path, micro_model_dir, "async", **{"trainer.mode": "async", "trainer.max_staleness": 0})
    same = _final_weights(run)
    assert sync.keys() == same.keys() and all(torch.equal(sync[k], same[k]) for k in sync)
    assert not _producer_threads()  # the run closed it


@pytest.mark.parametrize("eta", [1, 2])
def test_no_trained_rollout_is_more_than_eta_versions_old(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch, eta: int
) -> None:
    """A slow learner (0.3 s a step) lets the producer run as far ahead as admission allows: every rollout
    a step trains on was sampled by a version at most η behind the learner's, and some by an older one
    than the learner's (the producer did run ahead). The logged staleness says the same."""
    seen: list[tuple[int, int, int]] = []  # (learner version, oldest rollout version, newest)
    real_learn = Learner.learn

    def slow_learn(self: Learner, groups: ScoredGroups, step: int) -> dict[str, Any]:
        time.sleep(0.3)
        versions = [r.policy_version for r in groups.rollouts]
        seen.append((loop_parts[0].weights.version, min(versions), max(versions)))
        return real_learn(self, groups, step)

    loop_parts: list[Any] = []
    real_setup = loop.setup_components

    def recording_setup(cfg: Any) -> Any:
        loop_parts.append(real_setup(cfg))
        return loop_parts[0]

    monkeypatch.setattr(loop, "setup_components", recording_setup)
    monkeypatch.setattr(Learner, "learn", slow_learn)
    run = _run(
        tmp_path,
        micro_model_dir,
        "ahead",
        **{"run.steps": 6, "run.save_every": 6, "trainer.mode": "async", "trainer.max_staleness": eta},
    )
    assert [v for v, _, _ in seen] == list(range(6))  # every step trained and published once
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


def test_a_failing_producer_ends_the_run_with_its_error_and_leaves_no_thread(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_produce = Producer.produce

    def failing(self: Producer, prompts: PromptBatch) -> ScoredGroups:
        if prompts.step == 2:
            raise ConnectionError("judge returned HTTP 502")
        return real_produce(self, prompts)

    monkeypatch.setattr(Producer, "produce", failing)
    started = time.perf_counter()
    with pytest.raises(ConnectionError, match="HTTP 502"):
        _run(tmp_path, micro_model_dir, "fails", **{"run.steps": 5, "trainer.mode": "async"})
    assert time.perf_counter() - started < 60
    assert not _producer_threads()


def _producer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hone-producer" and t.is_alive()]


def test_ctrl_c_in_async_mode_is_one_line_and_leaves_no_producer_thread(
    tmp_path: Path,
    micro_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hone.cli import main
    from tests.test_cli import tiny_run

    real_step = loop.rl_step

    def step_until_interrupted(step: int, *args: Any) -> dict[str, float]:
        if step == 2:
            raise KeyboardInterrupt
        return real_step(step, *args)

    monkeypatch.setattr(loop, "rl_step", step_until_interrupted)
    args = tiny_run(tmp_path, micro_model_dir, **{"run.steps": 6, "trainer.mode": "async"})
    assert main(["train", *args, "trainer.max_staleness=2"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("hone: interrupted at step 2;")
    assert not _producer_threads()


def test_sigkill_and_resume_in_async_mode_logs_every_step_once(tmp_path: Path, micro_model_dir: Path) -> None:
    """The checkpoint holds the version counter (the step); steps that were buffered or in flight at the
    kill are submitted again on resume, from the same prompts and seeds, so no row is lost or repeated
    (`_killed_and_resumed` checks rows 0..8 and that the resumed steps trained)."""
    from tests.test_orchestration import _killed_and_resumed

    _killed_and_resumed(tmp_path, micro_model_dir, **{"trainer.mode": "async", "trainer.max_staleness": 2})

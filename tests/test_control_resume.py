"""Checkpoints and `hone train --resume` of a control run (issue 32): PPO and SAC resume exactly."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hone.cli import main
from hone.tracking import read_metrics

pytest.importorskip("gymnasium")

TIMING = {"env/steps_per_s", "time/step_s", "time/elapsed_s"}


def _args(tmp_path: Path, name: str, algorithm: str, steps: int) -> list[str]:
    if algorithm == "ppo":  # CartPole: 8 envs x 32 steps per RL step, observations and rewards normalised
        recipe = "cartpole-ppo"
        extra = {
            "control.env_steps": steps * 256,
            "control.normalize_obs": "true",
            "control.normalize_reward": "true",
            "control.schedule": "constant",  # linear decays over the run's length: K and 2K steps differ
        }
    else:  # Pendulum (or Hopper): 70 steps per RL step, so a checkpoint falls mid-episode
        recipe = "pendulum-sac"
        env = {"control.env": "Hopper-v5"} if algorithm == "sac-mujoco" else {}
        extra = {
            **env,
            "control.algorithm": algorithm.removesuffix("-mujoco"),
            "control.env_steps": steps * 70,
            "control.rollout_steps": 70,
            "control.offpolicy.learning_starts": 100,
            "control.offpolicy.batch_size": 32,
            "control.hidden_sizes": "[32,32]",
        }
    settings = {
        "run.dir": tmp_path,
        "run.name": name,
        "run.eval_every": 1,
        "run.save_every": 1,
        "control.eval_episodes": 1,
        "logging.progress": "false",
        "logging.tensorboard": "false",
        "logging.plot": "[]",
        **extra,
    }
    return [recipe, *(f"{k}={v}" for k, v in settings.items())]


def _saved(run: Path, step: int) -> dict[str, torch.Tensor]:
    """The checkpoint's policy and every optimizer/learner tensor, flattened to one dict."""
    folder = run / "checkpoints" / f"step-{step}"
    out = {f"policy/{k}": v for k, v in load_file(str(folder / "model" / "policy.safetensors")).items()}
    for file in ("optimizer.pt", "learner.pt"):
        if (folder / file).is_file():
            out |= _flat(torch.load(folder / file, weights_only=True), file)
    return out


def _flat(tree: object, prefix: str) -> dict[str, torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}/{key}").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in _flat(sub, f"{prefix}/{i}").items()}
    return {prefix: torch.tensor(float(tree))} if isinstance(tree, (int, float)) else {}


def _rows(run: Path) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in read_metrics(run / "metrics.jsonl")]


@pytest.mark.parametrize("algorithm", ["ppo", "sac", "td3", "sac-mujoco"])
def test_k_steps_then_resume_for_k_more_is_bit_identical_to_2k_steps(
    tmp_path: Path, algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if algorithm == "sac-mujoco":  # Hopper: episodes end (and reset) often; the physics is saved apart
        pytest.importorskip("mujoco")
        monkeypatch.chdir(tmp_path)  # MuJoCo writes its warnings to MUJOCO_LOG.TXT in the current folder
    k = 2 if algorithm == "ppo" else 3
    assert main(["train", *_args(tmp_path, "whole", algorithm, 2 * k)]) == 0
    assert main(["train", *_args(tmp_path, "half", algorithm, k)]) == 0
    env_steps = (256 if algorithm == "ppo" else 70) * 2 * k
    assert main(["train", "--resume", str(tmp_path / "half"), f"control.env_steps={env_steps}"]) == 0
    whole, resumed = _saved(tmp_path / "whole", 2 * k), _saved(tmp_path / "half", 2 * k)
    assert whole.keys() == resumed.keys() and len(whole) > 10
    different = [name for name in whole if not torch.equal(whole[name], resumed[name])]
    assert different == []
    # the same training episodes, losses and evals, step by step (the resumed log has no second start eval)
    assert _rows(tmp_path / "whole") == _rows(tmp_path / "half")
    if algorithm != "ppo":  # the replay buffer went on exactly too
        a = (tmp_path / "whole" / "checkpoints" / f"step-{2 * k}" / "replay" / "replay.npz").read_bytes()
        b = (tmp_path / "half" / "checkpoints" / f"step-{2 * k}" / "replay" / "replay.npz").read_bytes()
        assert a == b


def test_envs_that_cannot_be_saved_are_reset_with_a_seed_from_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An async or MuJoCo vector env is not pickled: a resume resets it with run.seed + 1000 x step, so
    resuming the same checkpoint twice gives the same run (not the unbroken run's)."""
    monkeypatch.setattr("hone.control.checkpoint._pickled", lambda envs, obs: None)
    assert main(["train", *_args(tmp_path, "a", "sac", 3)]) == 0
    assert not (tmp_path / "a" / "checkpoints" / "step-3" / "envs" / "envs.pkl").exists()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for run in ("a", "b"):
        with caplog.at_level(logging.INFO, logger="hone"):
            assert main(["train", "--resume", str(tmp_path / run), "control.env_steps=420"]) == 0
    assert "the environments were not saved; reset with seed 3000" in caplog.text
    a, b = _saved(tmp_path / "a", 6), _saved(tmp_path / "b", 6)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_resume_without_a_checkpoint_or_from_a_damaged_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(tmp_path, "r", "sac", 2)
    assert main(["train", *args[:1], *args[1:], "run.save_every=0"]) == 0  # the final checkpoint only
    checkpoints = tmp_path / "r" / "checkpoints"
    assert [p.name for p in checkpoints.iterdir()] == ["step-2"]
    replay = checkpoints / "step-2" / "replay" / "replay.npz"
    replay.write_bytes(replay.read_bytes()[:100])  # cut short
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "r"), "control.env_steps=280"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot resume from {checkpoints / 'step-2'}: " in err
    (checkpoints / "step-2" / "learner.pt").write_bytes(b"not a zip")  # now damage() sees it
    assert main(["train", "--resume", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "every checkpoint in" in err and "is damaged" in err
    shutil.rmtree(checkpoints)
    assert main(["train", "--resume", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checkpoint in" in err


def test_an_interrupted_run_says_where_and_resumes_to_the_unbroken_runs_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *_args(tmp_path, "whole", "sac", 4)]) == 0
    from hone.control.loops import offpolicy as control_offpolicy

    real, calls = control_offpolicy.evaluate, []

    def interrupted(*args: object, **kwargs: object) -> dict[str, float]:
        calls.append(1)
        if len(calls) == 4:  # the eval of RL step 3 (after the start eval and steps 1, 2)
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(control_offpolicy, "evaluate", interrupted)
    capsys.readouterr()
    assert main(["train", *_args(tmp_path, "cut", "sac", 4)]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted at step 2; last checkpoint step 2; resume with" in err
    monkeypatch.setattr(control_offpolicy, "evaluate", real)
    # no final model yet: `hone eval --run` plays the newest checkpoint's actor (step 2), as logged there
    assert main(["eval", "--run", str(tmp_path / "cut"), "--out", str(tmp_path / "e.json")]) == 0
    logged = [row for row in read_metrics(tmp_path / "cut" / "metrics.jsonl") if row["step"] == 2]
    assert json.loads((tmp_path / "e.json").read_text())["eval/return"] == logged[0]["eval/return"]
    assert main(["train", "--resume", str(tmp_path / "cut")]) == 0
    whole, resumed = _saved(tmp_path / "whole", 4), _saved(tmp_path / "cut", 4)
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)
    assert _rows(tmp_path / "whole") == _rows(tmp_path / "cut")


def test_resume_with_another_envs_shapes_names_the_settings_not_a_state_dict_dump(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51: `--resume` with `control.env` of another shape was torch's 393-character state_dict dump."""
    assert main(["train", *_args(tmp_path, "c", "ppo", 2)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "c"), "control.env=Acrobot-v1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "copying a param" not in err
    assert "actor.0.weight is [64, 4], this run's is [64, 6]" in err and "control.env" in err

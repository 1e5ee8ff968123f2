"""The run contract of the control families (issue 48): one-agent PPO, SAC/TD3 and a team (MAPPO) each
dry-run without writing, honour `run.time_limit_s`, end on SIGTERM with one line and a resumable checkpoint,
resume, and summarise in their own terms; every impossible combination is one line before anything starts.
The offline family's are in tests/test_control_offline.py (they need its dataset), the language-model
families' in tests/test_cli.py and tests/test_run_preference_families.py."""

from __future__ import annotations

import ast
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hone.cli import main
from hone.config import ConfigError, load_config
from hone.control.algos import check_algorithm
from hone.tracking import read_metrics

pytest.importorskip("gymnasium")

REPO = Path(__file__).resolve().parents[1]
PAIR = "pettingzoo:tests.control_envs_for_tests"
SIGNAL_AFTER = "tests.control_envs_for_tests:SignalAfter"
QUIET = ["logging.progress=false", "logging.tensorboard=false", "logging.plot=[]", "control.eval_episodes=1"]
# One small run per family: (recipe, its overrides); each RL step is a few hundred environment steps.
FAMILIES = {
    "ppo": ("cartpole-ppo", ["control.env_steps=1024", "control.rollout_steps=32"]),
    "sac": (
        "pendulum-sac",
        [
            "control.env_steps=600",
            "control.rollout_steps=100",
            "control.offpolicy.learning_starts=50",
            "control.offpolicy.batch_size=16",
            "control.hidden_sizes=[16,16]",
        ],
    ),
    "td3": (
        "hopper-td3",
        [
            "control.env=Pendulum-v1",
            "control.num_envs=1",
            "control.env_steps=600",
            "control.rollout_steps=100",
            "control.offpolicy.learning_starts=50",
            "control.offpolicy.batch_size=16",
            "control.hidden_sizes=[16,16]",
        ],
    ),
    "team": (
        "simple-spread-mappo",
        [
            f"control.env={PAIR}",
            "control.env_args={limit: 5}",
            "control.num_envs=2",
            "control.rollout_steps=8",
            "control.env_steps=64",
            "control.normalize_obs=true",
            "control.ppo.mini_batches=2",
        ],
    ),
}


def _run(tmp_path: Path, family: str, name: str, *extra: str) -> list[str]:
    recipe, overrides = FAMILIES[family]
    if family == "team":
        pytest.importorskip("pettingzoo")
    return [recipe, f"run.dir={tmp_path}", f"run.name={name}", *QUIET, *overrides, *extra]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_dry_run_builds_everything_and_writes_nothing(
    family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *_run(tmp_path, family, "dry"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run:" in out and "nothing was trained or written" in out
    assert "parameters" in out  # the networks were built
    assert not (tmp_path / "dry").exists()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_time_budget_ends_a_run_after_the_step_that_spends_it(
    family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *_run(tmp_path, family, "t", "run.time_limit_s=1e-9", "run.save_every=0")]) == 0
    out = capsys.readouterr().out
    assert "RL steps        1 (" in out and "(run.time_limit_s reached)" in out
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["stopped_by"] == "time limit" and summary["family"] == "control"
    assert (tmp_path / "t" / "checkpoints" / "step-1").is_dir()  # the last step is saved, to resume from
    assert [row["step"] for row in read_metrics(tmp_path / "t" / "metrics.jsonl")] == [0, 1]


# (family, the env's step at which SIGTERM arrives, the override that plants it)
SIGNALLED = {
    # 8 envs x 32 steps per RL step, after an eval of under 40 steps: step 600 is in RL step 3
    "ppo": ("control.env", SIGNAL_AFTER, "{env: CartPole-v1, steps: 600, token: %s}"),
    # an eval of 200 steps, then 100 per RL step: step 450 is in RL step 3
    "sac": ("control.env", SIGNAL_AFTER, "{env: Pendulum-v1, steps: 450, token: %s}"),
    # an eval of 5 steps, then 2 copies x 8 steps per RL step: step 45 is in RL step 3
    "team": ("control.env", PAIR, "{limit: 5, sigterm_at: 45, token: %s}"),
}


@pytest.mark.parametrize("family", list(SIGNALLED))
def test_sigterm_ends_a_run_in_one_line_with_a_checkpoint_it_resumes_from(
    family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, env, args = SIGNALLED[family]
    run = tmp_path / "s"
    started = time.monotonic()
    code = main(
        [
            "train",
            *_run(
                tmp_path, family, "s", f"{key}={env}", f"control.env_args={args % run}", "run.save_every=1"
            ),
        ]
    )
    assert code == 128 + signal.SIGTERM and time.monotonic() - started < 60
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"hone: interrupted at step 2; last checkpoint step 2; resume with `hone train --resume {run}`"
    ]
    assert not (run / "summary.json").exists()
    assert main(["train", "--resume", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    rows = read_metrics(run / "metrics.jsonl")
    assert summary["stopped_by"] == "end" and rows[-1]["step"] == summary["steps"] > 2
    assert [row["step"] for row in rows] == list(range(summary["steps"] + 1))  # no step twice, none lost


def test_sigterm_to_an_async_run_ends_it_in_one_line_without_waiting_on_its_workers(tmp_path: Path) -> None:
    """gymnasium's polite close of an AsyncVectorEnv waited on its workers' pipes for ever after a signal
    to the process group (the issue: over 90 s); the run terminates them instead."""
    args = _run(
        tmp_path,
        "ppo",
        "a",
        "control.vectorization=async",
        "control.num_envs=2",
        "control.env_steps=1000000",
        "run.save_every=1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "hone.cli", "train", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        metrics, deadline = tmp_path / "a" / "metrics.jsonl", time.monotonic() + 120
        while not (metrics.exists() and '"step": 2' in metrics.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the run never reached step 2"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)  # the whole group, as a scheduler or Ctrl-C does
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - sent < 10, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    lines = [line for line in err.strip().splitlines() if not line.startswith("hone: the machine is busy")]
    assert len(lines) == 1 and lines[0].startswith("hone: interrupted at step ") and "resume with" in lines[0]


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    folder = run / "checkpoints" / f"step-{step}"
    weights = load_file(str(folder / "model" / "policy.safetensors"))
    optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
    return weights | {
        f"adam/{k}/{n}": v for k, s in optimizer["state"].items() for n, v in s.items() if n != "step"
    }


def test_a_team_resumed_from_mid_episode_ends_as_the_unbroken_run(tmp_path: Path) -> None:
    """A team's envs (PettingZoo) do not pickle: a checkpoint keeps each copy's episode seed and actions,
    and a resume replays them, so the resumed run takes exactly the unbroken run's steps."""
    # checkpoints fall mid-episode; an eval every step, as the unbroken run's last step is not the half's
    episode_cut = ["control.env_args={limit: 5}", "control.rollout_steps=7", "run.eval_every=1"]
    whole = _run(
        tmp_path,
        "team",
        "whole",
        *episode_cut,
        "control.env_steps=112",
        "run.save_every=1",
        "control.schedule=constant",
    )
    half = _run(
        tmp_path,
        "team",
        "half",
        *episode_cut,
        "control.env_steps=56",
        "run.save_every=1",
        "control.schedule=constant",
    )
    assert main(["train", *whole]) == 0 and main(["train", *half]) == 0
    assert main(["train", "--resume", str(tmp_path / "half"), "control.env_steps=112"]) == 0
    a, b = _weights(tmp_path / "whole", 8), _weights(tmp_path / "half", 8)
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
    drop = {"env/steps_per_s"}
    rows = [
        {k: v for k, v in r.items() if k not in drop}
        for r in read_metrics(tmp_path / "whole" / "metrics.jsonl")
    ]
    again = [
        {k: v for k, v in r.items() if k not in drop}
        for r in read_metrics(tmp_path / "half" / "metrics.jsonl")
    ]
    assert rows == again


def test_a_plugin_control_algorithm_is_one_file_with_its_own_hyperparameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin = ["run.plugins=[tests.control_algorithm_for_tests]", "control.algorithm=td3_decay"]
    args = _run(tmp_path, "sac", "p", *plugin, "control.args={noise_decay: 0.5}")
    assert main(["train", *args]) == 0
    noise = [row["noise/std"] for row in read_metrics(tmp_path / "p" / "metrics.jsonl") if "noise/std" in row]
    assert noise and noise[-1] < 1e-6 < 0.1  # 0.1 halved at every update
    assert (tmp_path / "p" / "model" / "policy.safetensors").is_file()
    capsys.readouterr()
    assert main(["train", *_run(tmp_path, "sac", "q", *plugin, "control.args={noise_decai: 0.5}")]) == 2
    assert "control.args.noise_decai: Extra inputs are not permitted" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize(
    ("family", "overrides", "line"),
    [
        ("team", ["control.algorithm=sac"], "control.algorithm sac does not train teams"),
        ("ppo", ["control.algorithm=dqn"], "control.algorithm 'dqn' is not a registered control algorithm"),
        ("ppo", ["trainer.world_size=2"], "control: runs in one process"),
        ("ppo", ["cluster.backend=ray"], "control: runs in one process"),
        ("ppo", ["cluster.mode=async"], "control: runs in one process"),
        (
            "ppo",
            ["algorithm.kl.coef=0.1", "rollout.n=4"],
            "rollout.n, algorithm.kl.coef: language-model keys",
        ),
        ("ppo", ["run.steps=5"], "run.steps: language-model keys"),
        (
            "ppo",
            ["control.offpolicy.batch_size=4"],
            "control.offpolicy.batch_size: not read by control.algorithm",
        ),
        ("sac", ["control.ppo.lam=0.9"], "control.ppo.lam: not read by control.algorithm sac"),
        ("ppo", ["data.source=x.jsonl"], "data.source: control.algorithm ppo learns from its environment"),
        ("ppo", ["control.args={a: 1}"], "control.args: control.algorithm ppo declares no args"),
    ],
)
def test_an_impossible_combination_is_one_line_before_anything_starts(
    family: str, overrides: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *_run(tmp_path, family, "x", *overrides)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0], err
    assert not (tmp_path / "x").exists()


def test_old_spellings_of_control_keys_are_read_once_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = ["control.batch_size=32", "trainer.lr=1e-3", "algorithm.gamma=0.95", "control.offline_updates=7"]
    with caplog.at_level(logging.WARNING, logger="hone"):
        moved = load_config("pendulum-iql", old)  # an override wins over the recipe, as ever
    (record,) = [r for r in caplog.records if "keys have moved" in r.message]
    assert "trainer.lr -> control.lr" in record.message
    assert "control.batch_size -> control.offpolicy.batch_size" in record.message
    new = [
        "control.offpolicy.batch_size=32",
        "control.lr=1e-3",
        "control.gamma=0.95",
        "control.offline.updates=7",
    ]
    assert moved.control == load_config("pendulum-iql", new).control
    check_algorithm(moved)
    recipe = tmp_path / "both.yaml"  # one recipe, both spellings: which one is meant cannot be known
    recipe.write_text("control: {env: CartPole-v1, gamma: 0.9}\nalgorithm: {gamma: 0.5}\n")
    with pytest.raises(ConfigError, match=r"algorithm.gamma and control.gamma are both set"):
        load_config(recipe)
    with pytest.raises(ConfigError, match=r"algorithm.advantage: language-model keys"):
        load_config(
            "cartpole-ppo", ["algorithm.advantage=rloo"]
        )  # only `gae` was ever read: it alone is dropped


def test_a_refused_start_writes_nothing_and_a_run_without_checkpoint_is_started_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    assert main(["train", *_run(tmp_path, "ppo", "r", "control.env=CartPol-v1")]) == 2
    assert not (tmp_path / "r").exists()  # the same command, fixed, is not refused as "already holds a run"
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 0}\n')  # a start that stopped before saving
    with caplog.at_level(logging.INFO, logger="hone"):
        assert main(["train", *_run(tmp_path, "ppo", "r", "run.save_every=0")]) == 0
    assert any("stopped before its first checkpoint" in r.message for r in caplog.records)
    capsys.readouterr()
    assert main(["train", *_run(tmp_path, "ppo", "r")]) == 2  # now it finished: refused, no resume offered
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "already holds a run; choose another run.name" in err and "--resume" not in err


def test_a_cartpole_run_loads_no_language_model_code(tmp_path: Path) -> None:
    code = (
        "import sys; from hone.cli import main; "
        f"main(['train', *{_run(tmp_path, 'ppo', 'i', 'control.env_steps=256')!r}]); "
        "print(sorted(m for m in sys.modules if m.startswith(('hone', 'transformers', 'peft', 'mcp', "
        "'openenv', 'ray'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    llm = (
        "hone.rl.",
        "hone.rollout.engines.hf",
        "hone.rollout.engines.vllm",
        "hone.envs",
        "hone.rollout.agent",
        "hone.rewards",
        "hone.training.policy",
        "hone.training.sft",
        "hone.training.dpo",
        "transformers",
        "peft",
        "mcp",
        "openenv",
        "ray",
    )
    names_only = {"hone.rl.placement", "hone.rl.placement.backends"}  # back-end names, as config checks them
    assert [m for m in loaded if m.startswith(llm) and m not in names_only] == []
    assert [m for m in loaded if m.startswith("hone.control")]


def test_a_language_model_dry_run_is_one_line_on_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a start's set-up: a model that cannot be found is one line (it was a traceback), nothing written."""
    args = [f"run.dir={tmp_path}", "run.name=lm", f"model.path={tmp_path / 'no-such-model'}", "--dry-run"]
    assert main(["train", *args]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "machine is busy" not in line]
    assert len(err) == 1 and err[0].startswith("hone: error: ") and "no-such-model" in err[0], err
    assert not (tmp_path / "lm").exists()

"""Offline RL (issue 33): Minari datasets written by `hone collect` and read by Minari and by Hone, the
offline learners through `hone train`, `--init` offline-to-online, FQE, and one-line errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hone.cli import main
from hone.control.datasets import Episode, _held_out, load_offline, write_dataset
from hone.control.errors import ControlEnvError
from hone.control.offpolicy import GaussianActor
from hone.control.ope import fqe
from hone.tracking import read_metrics

pytest.importorskip("gymnasium")
minari = pytest.importorskip("minari")

DATASET = "hone/pendulum/test-v0"
REFS = (-1200.0, -150.0)


def _quiet(tmp_path: Path, name: str) -> list[str]:
    return [
        f"run.dir={tmp_path / 'runs'}",
        f"run.name={name}",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.plot=[]",
        "control.eval_episodes=2",
    ]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 12-episode random Pendulum dataset written by `hone collect` (module-wide: written once)."""
    folder = tmp_path_factory.mktemp("minari")
    code = main(
        [
            "collect",
            "pendulum-iql",
            "--policy",
            "random",
            "--episodes",
            "12",
            "--dataset-id",
            DATASET,
            "--out",
            str(folder),
            "--ref-min-score",
            str(REFS[0]),
            "--ref-max-score",
            str(REFS[1]),
        ]
    )
    assert code == 0
    return folder


def _offline(tmp_path: Path, root: Path, name: str, *extra: str) -> list[str]:
    return [
        "train",
        "pendulum-iql",
        f"data.source=minari:{DATASET}",
        f"control.offline.dataset_root={root}",
        "control.offline.updates=200",
        "control.offline.updates_per_step=100",
        "control.hidden_sizes=[32,32]",
        "control.offpolicy.batch_size=64",
        *_quiet(tmp_path, name),
        *extra,
    ]


def test_minari_reads_what_hone_collect_wrote(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    data = minari.load_dataset(DATASET)
    assert data.total_episodes == 12 and data.total_steps == 12 * 200
    episode = next(iter(data.iterate_episodes()))
    assert episode.observations.shape == (201, 3) and episode.actions.shape == (200, 1)
    assert episode.truncations[-1] and not episode.terminations.any()  # Pendulum's time limit
    assert data.recover_environment().spec.id == "Pendulum-v1"
    # D4RL's normalisation from the reference scores given to `hone collect`
    assert minari.get_normalized_score(data, np.array([-675.0]))[0] == pytest.approx(0.5)


def test_transitions_of_whole_episodes_with_actions_in_unit_range(root: Path) -> None:
    import gymnasium as gym

    env = gym.make("Pendulum-v1")
    data = load_offline(
        f"minari:{DATASET}",
        root=str(root),
        observation_space=env.observation_space,
        action_space=env.action_space,
        holdout=0.25,
    )
    assert data.holdout is not None
    assert data.train.episodes + data.holdout.episodes == 12 and data.holdout.episodes >= 1
    assert len(data.train) == 200 * data.train.episodes
    stored = minari.MinariDataset(str(root / DATASET / "data"))
    episodes = {e.id: e for e in stored.iterate_episodes()}
    first = episodes[min(i for i in episodes if not _held_out(i, 0.25))]
    np.testing.assert_allclose(data.train.actions[:200, 0], first.actions[:, 0] / 2.0, rtol=1e-6)  # ±2 → ±1
    np.testing.assert_array_equal(
        data.train.next_obs[:199], data.train.obs[1:200]
    )  # o_{t+1} within an episode
    np.testing.assert_allclose(data.train.next_obs[199], first.observations[200])  # the final observation
    assert not data.train.terminated.any()  # a truncation bootstraps
    assert data.normalized_score(-675.0) == pytest.approx(50.0)
    again = load_offline(
        f"minari:{DATASET}",
        root=str(root),
        observation_space=env.observation_space,
        action_space=env.action_space,
        holdout=0.25,
    )
    assert again.holdout is not None and again.holdout.episodes == data.holdout.episodes  # fixed by id


def test_iql_trains_saves_and_hone_eval_plays_it(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_offline(tmp_path, root, "iql")) == 0
    run = tmp_path / "runs" / "iql"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["offline/updates"] for r in rows if r["step"] > 0] == [100.0, 200.0]
    last = rows[-1]
    assert {"loss/v", "loss/q", "loss/actor", "q/mean", "v/mean", "adv_weight/mean", "val/action_mse"} <= set(
        last
    )
    assert last["eval/normalized_score"] == pytest.approx(
        100 * (last["eval/return"] - REFS[0]) / (REFS[1] - REFS[0])
    )
    assert (run / "model" / "policy.safetensors").is_file() and (run / "model" / "learner.pt").is_file()
    assert "normalized score" in capsys.readouterr().out
    assert main(["eval", "--run", str(run)]) == 0  # the saved policy and the dataset's statistics
    assert f"{last['eval/return']:.4f}" in capsys.readouterr().out.replace(" ", " ")


@pytest.mark.parametrize("algorithm", ["bc", "td3_bc", "awr", "cql"])
def test_every_offline_algorithm_trains(tmp_path: Path, root: Path, algorithm: str) -> None:
    extra = ["control.offline.cql_samples=2"] if algorithm == "cql" else []
    assert main(_offline(tmp_path, root, algorithm, f"control.algorithm={algorithm}", *extra)) == 0
    last = read_metrics(tmp_path / "runs" / algorithm / "metrics.jsonl")[-1]
    assert math.isfinite(last["eval/return"]) and math.isfinite(last["loss/actor"])
    assert ("loss/cql" in last) == (algorithm == "cql")


def test_init_goes_on_online_from_the_offline_learner(tmp_path: Path, root: Path) -> None:
    assert main(_offline(tmp_path, root, "offline-run")) == 0
    offline_final = read_metrics(tmp_path / "runs" / "offline-run" / "metrics.jsonl")[-1]["eval/return"]
    online = ["control.offline.updates=0", "control.offline.online_steps=400", "control.rollout_steps=200"]
    assert (
        main(
            [
                *_offline(tmp_path, root, "online-run", *online),
                "--init",
                str(tmp_path / "runs" / "offline-run"),
            ]
        )
        == 0
    )
    rows = read_metrics(tmp_path / "runs" / "online-run" / "metrics.jsonl")
    assert rows[0]["eval/return"] == pytest.approx(offline_final)  # the same policy, before any online step
    assert [r["env/steps"] for r in rows if r["step"] > 0] == [200.0, 400.0]
    assert "episode/return" in rows[-1] and "loss/q" in rows[-1]


def test_init_keeps_this_runs_learning_rates(tmp_path: Path, root: Path) -> None:
    """The offline run's optimizer moments, but the fine-tuning run's own `control.lr` (a loaded Adam state
    would otherwise bring back the offline run's)."""
    import gymnasium as gym

    from hone.config import load_config
    from hone.control.algos import control_algorithm
    from hone.control.loops.offline import load_learner

    assert (
        main(_offline(tmp_path, root, "lr-source", "control.algorithm=cql", "control.offline.cql_samples=2"))
        == 0
    )
    cfg = load_config("pendulum-iql", ["control.algorithm=cql", "control.hidden_sizes=[32,32]",
                                       "control.lr=1e-5", "control.offpolicy.q_lr=2e-5"])  # fmt: skip
    assert cfg.control is not None
    make = control_algorithm("cql").learner
    assert make is not None
    learner = make(cfg.control, 3, gym.spaces.Box(-2.0, 2.0, (1,)))
    load_learner(learner, tmp_path / "runs" / "lr-source", cfg.control)
    assert learner.actor_opt.param_groups[0]["lr"] == 1e-5
    assert learner.critic_opt.param_groups[0]["lr"] == 2e-5
    assert learner.actor_opt.state  # the moments did come from the offline run


def test_behaviour_cloning_recovers_a_deterministic_policy(tmp_path: Path) -> None:
    """Episodes of a(s) = clip(-0.5 · θ̇) (a deterministic linear policy): BC's held-out action error
    is a small fraction of the data's action variance (a constant policy's error would be all of it)."""
    import gymnasium as gym

    env = gym.make("Pendulum-v1")
    episodes = []
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        observations, actions, rewards = [obs], [], []
        for _ in range(200):
            action = np.clip([-0.5 * obs[2]], -2.0, 2.0).astype(np.float32)
            obs, reward, *_ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(float(reward))
        done = np.zeros(200, bool)
        episodes.append(
            Episode(
                np.array(observations),
                np.array(actions),
                np.array(rewards),
                done,
                np.r_[done[:-1], True],
                seed=seed,
            )
        )
    write_dataset("hone/pendulum/linear-v0", episodes, root=tmp_path / "ds", env=env, algorithm_name="linear")
    args = _offline(
        tmp_path,
        tmp_path / "ds",
        "bc",
        "control.algorithm=bc",
        "data.source=minari:hone/pendulum/linear-v0",
        "control.offline.updates=600",
        "control.offline.holdout=0.2",
        "control.lr=1e-3",
    )
    assert main(args) == 0
    rows = read_metrics(tmp_path / "runs" / "bc" / "metrics.jsonl")
    data_var = float(np.var(np.concatenate([e.actions for e in episodes]) / 2.0))
    assert rows[-1]["val/action_mse"] < 0.02 * data_var


def test_fqe_estimates_a_known_discounted_value() -> None:
    """Reward 1 on every step, never terminal: Q^π = 1 / (1 - γ) = 10 at γ = 0.9, for any policy."""
    from hone.control.datasets import Transitions

    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (2000, 2)).astype(np.float32)
    data = Transitions(
        obs,
        rng.uniform(-1, 1, (2000, 1)).astype(np.float32),
        np.ones(2000, np.float32),
        rng.uniform(-1, 1, (2000, 2)).astype(np.float32),
        np.zeros(2000, np.float32),
        10,
    )
    import gymnasium as gym

    policy = GaussianActor(2, gym.spaces.Box(-1.0, 1.0, (1,)), [16])
    estimate = fqe(policy, data, obs[:50], gamma=0.9, updates=3000, hidden=(32, 32), lr=1e-3, tau=0.05)
    assert estimate == pytest.approx(10.0, rel=0.1)


def test_gaussian_actor_log_prob_is_the_normal_density() -> None:
    import gymnasium as gym

    actor = GaussianActor(3, gym.spaces.Box(-2.0, 2.0, (2,)), [8])
    obs, action = torch.zeros(1, 3), torch.tensor([[0.5, -1.0]])  # on the bound: finite (not squashed)
    mean = actor(obs)[0].detach()  # log σ starts at 0: σ = 1
    by_hand = float((-0.5 * (action[0] - mean) ** 2 - 0.5 * math.log(2 * math.pi)).sum())
    assert float(actor.log_prob(obs, action).detach()) == pytest.approx(by_hand, rel=1e-5)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("data.source=minari:hone/pendulum/missing-v0", "no Minari dataset hone/pendulum/missing-v0 under"),
        ("data.source=data.jsonl", "reads a Minari dataset, minari:<id>"),
        ("control.env=MountainCarContinuous-v0", "observation space Box"),
        ("control.normalize_reward=true", "not with an offline algorithm"),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, root: Path, override: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_offline(tmp_path, root, "bad"), override]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_missing_storage_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n in ("pyarrow", "h5py") else real(n, *a)
    )
    with pytest.raises(
        ControlEnvError, match=r"data.source minari:x/y-v0: Minari has no storage backend.*hone\[offline\]"
    ):
        load_offline("minari:x/y-v0", root="/nonexistent", observation_space=None, action_space=None)


def test_no_dataset_no_overwrite_and_init_mismatch_are_one_line(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gymnasium as gym

    with pytest.raises(ControlEnvError, match="exists; choose another id"):
        write_dataset(
            DATASET,
            [Episode(np.zeros((2, 3)), np.zeros((1, 1)), np.zeros(1), np.zeros(1, bool), np.ones(1, bool))],
            root=root,
            env=gym.make("Pendulum-v1"),
            algorithm_name="x",
        )
    with pytest.raises(ControlEnvError, match="no episodes to write"):
        write_dataset("hone/empty-v0", [], root=tmp_path, env=gym.make("Pendulum-v1"), algorithm_name="x")
    assert main([*_offline(tmp_path, root, "nodata"), "data.source=null"]) == 2
    assert "set data.source: minari:<id>" in capsys.readouterr().err
    assert main(_offline(tmp_path, root, "b", "control.algorithm=bc", "control.offline.updates=100")) == 0
    assert main([*_offline(tmp_path, root, "i"), "--init", str(tmp_path / "runs" / "b")]) == 2
    assert "not a control.algorithm iql learner of this shape" in capsys.readouterr().err
    assert (
        main(["train", "cartpole-ppo", *_quiet(tmp_path, "p"), "--init", str(tmp_path / "runs" / "b")]) == 2
    )
    assert "--init: starts an offline algorithm" in capsys.readouterr().err


def test_hone_eval_ope_reports_fqe(tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_offline(tmp_path, root, "o", "control.algorithm=bc")) == 0
    capsys.readouterr()
    assert (
        main(["eval", "--run", str(tmp_path / "runs" / "o"), "--ope", "control.offline.fqe_updates=300"]) == 0
    )
    out = capsys.readouterr().out
    estimate = float(next(line for line in out.splitlines() if "ope/fqe_return" in line).split()[-1])
    assert -1700 < estimate < 0  # Pendulum's per-step reward is in [-16.3, 0]: |J_γ| ≤ 16.3 / (1 - γ)


def test_cql_pushes_q_down_on_actions_the_data_lacks() -> None:
    """Every dataset action is 0.5 and every transition ends (the target is the reward, 0): CQL's penalty
    makes Q lower at an action the data never took than at the data's, by a clear margin."""
    import gymnasium as gym

    from hone.config import load_config
    from hone.control.algos.offline import CQLLearner

    torch.manual_seed(0)
    cfg = load_config(
        "pendulum-iql", ["control.algorithm=cql", "control.hidden_sizes=[32,32]", "control.lr=1e-3"]
    )
    assert cfg.control is not None
    learner = CQLLearner(cfg.control, 3, gym.spaces.Box(-2.0, 2.0, (1,)), sac=True)
    obs = torch.rand(64, 3) * 2 - 1
    batch = {
        "obs": obs,
        "actions": torch.full((64, 1), 0.5),
        "rewards": torch.zeros(64),
        "next_obs": obs,
        "terminated": torch.ones(64),
    }
    for _ in range(300):
        metrics = learner.update(batch)
    with torch.no_grad():
        q_data = torch.minimum(*learner.critic(obs, torch.full((64, 1), 0.5))).mean()
        q_unseen = torch.minimum(*learner.critic(obs, torch.full((64, 1), -0.9))).mean()
    assert float(q_data - q_unseen) > 1.0 and "loss/cql" in metrics


def test_resume_of_an_offline_run_is_bit_identical(tmp_path: Path, root: Path) -> None:
    from safetensors.torch import load_file

    args = [
        *_offline(
            tmp_path, root, "whole", "control.offline.updates=400", "run.save_every=2", "run.keep_last=5"
        )
    ]
    assert main(args) == 0
    run = tmp_path / "runs" / "whole"
    whole = load_file(str(run / "model" / "policy.safetensors"))
    rows = read_metrics(run / "metrics.jsonl")
    import shutil

    shutil.rmtree(run / "checkpoints" / "step-4")  # as if the run had stopped after step 2's checkpoint
    shutil.rmtree(run / "model")
    assert main(["train", "--resume", str(run)]) == 0
    resumed = load_file(str(run / "model" / "policy.safetensors"))
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
    again = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in again] == [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert again[-1]["loss/actor"] == rows[-1]["loss/actor"]


def test_every_offline_algorithm_is_registered_with_a_learner() -> None:
    from hone.control.algos import CONTROL_ALGORITHMS

    offline = {name: a for name, a in CONTROL_ALGORITHMS.items() if a.loop == "offline"}
    assert set(offline) == {"bc", "td3_bc", "iql", "awr", "cql"}
    assert all(a.learner is not None and a.reads == ("offpolicy", "offline") for a in offline.values())


def test_the_offline_family_dry_runs_keeps_its_budget_and_resumes_after_sigterm(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run contract (issue 48) for offline learners: a dry run reads the dataset and writes nothing;
    `run.time_limit_s` ends the run after the step that spends it; SIGTERM (here during the eval after RL
    step 2, from the eval env) is one line with the checkpoint to resume from, and the resume finishes."""
    import json
    import signal

    assert main([*_offline(tmp_path, root, "d"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "training transitions" in out and "dry run:" in out
    assert not (tmp_path / "runs" / "d").exists()
    assert main(_offline(tmp_path, root, "t", "run.time_limit_s=1e-9")) == 0
    assert "(run.time_limit_s reached)" in capsys.readouterr().out
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert (summary["steps"], summary["updates"], summary["stopped_by"]) == (1, 100, "time limit")
    run = tmp_path / "runs" / "s"
    # evals at steps 0, 1 and 2 play 400 steps each (two Pendulum episodes): the 1000th is in step 2's
    signalled = [
        "control.env=tests.control_envs_for_tests:SignalAfter",
        f"control.env_args={{env: Pendulum-v1, steps: 1000, token: {run}}}",
        "run.eval_every=1",
        "run.save_every=1",
        "control.offline.updates=400",
    ]
    assert main(_offline(tmp_path, root, "s", *signalled)) == 128 + signal.SIGTERM
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        line
        == f"hone: interrupted at step 1; last checkpoint step 1; resume with `hone train --resume {run}`"
    )
    assert main(["train", "--resume", str(run)]) == 0
    assert [row["step"] for row in read_metrics(run / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_collect_onto_an_existing_dataset_id_is_refused_before_recording(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51: it used to record every episode (78 s for 5,000) and refuse only when writing."""
    from hone.control import collect as collect_module

    def must_not_record(*args: object, **kwargs: object) -> None:
        raise AssertionError("recorded episodes for a dataset id that exists")

    monkeypatch.setattr(collect_module, "record", must_not_record)
    argv = ["collect", "pendulum-iql", "--policy", "random", "--episodes", "5000", "--dataset-id", DATASET]
    assert main([*argv, "--out", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and f"--dataset-id {DATASET}" in err and "exists" in err


def test_a_truncated_episode_file_is_one_line_naming_the_dataset(root: Path, tmp_path: Path) -> None:
    """Issue 51: Minari reads episodes lazily, and a cut-off file was a 39-line traceback."""
    import shutil

    import gymnasium as gym

    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    damaged = sorted((copy / DATASET / "data").rglob("*.arrow"))[0]
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    env = gym.make("Pendulum-v1")
    with pytest.raises(ControlEnvError) as e:
        load_offline(
            f"minari:{DATASET}",
            root=str(copy),
            observation_space=env.observation_space,
            action_space=env.action_space,
        )
    line = str(e.value)
    assert line.startswith(f"data.source minari:{DATASET}: ") and "unreadable episode" in line
    assert "\n" not in line

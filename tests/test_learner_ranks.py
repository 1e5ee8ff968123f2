"""`hone train ... trainer.world_size=2`: two CPU learner ranks (gloo), started by `hone train` itself or by
torchrun, train as one process does; their checkpoints resume exactly, and at another world size; a rank
that fails or is killed ends the run with one line and leaves no process behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hone.cli import main
from hone.config import load_config
from hone.rl.loop import train
from hone.tracking import read_metrics
from tests.helpers import (
    REPO,
    TOKEN_REWARD,
    dpo_args,
    final_weights,
    logged_steps,
    tiny_overrides,
    wait_for,
    write_pairs,
)

# 3 prompts x 3 samples = 9 rows a step, over 2 mini-batches (5 and 4 rows) of micro-batches of 2: rank 0's
# shares (3, 2) take 2 and 1 micro-batches, rank 1's (2, 2) one each, so rank 1 pads its first mini-batch.
# A KL term (the reference's forward on every rank) and a gradient at every step (the token reward).
STEPS = {
    "run.steps": 3,
    "run.save_every": 1,
    "run.eval_every": 0,
    "data.prompts_per_step": 3,
    "rollout.n": 3,
    "trainer.mini_batches": 2,
    "trainer.micro_batch_size": 2,
    "algorithm.kl.coef": 0.05,
    "trainer.collective_timeout_s": 60,  # a mismatch of the ranks' collectives fails in a minute
    **TOKEN_REWARD,
}
PPO = {"algorithm.advantage": "gae", "critic.lr": 1e-3, "algorithm.kl.coef": 0}
# A distillation teacher (`tiny`: other weights, the same byte tokenizer) on every rank, beside the reference.
DISTILL = {"distill.teacher": "tiny", "distill.coef": 0.5}
LORA = {"model.lora.r": 4, "model.lora.alpha": 8}  # the KL reference: the base, the adapter disabled
WARM = {  # SFT on the ranks first; the KL reference is its result, which every rank loads
    "sft.enabled": "true",
    "sft.max_steps": 2,
    "sft.examples": 16,
    "sft.batch_size": 5,
    "sft.micro_batch_size": 2,
    "sft.val_size": 4,
}
TOLERANCE = 1e-5  # fp32: AdamW turns float-order noise on a near-zero gradient into steps this size


def hone_cli(argv: list[str], cwd: Path, *, torchrun: bool = False) -> subprocess.CompletedProcess[str]:
    """`hone <argv>` in a subprocess (under torchrun with 2 ranks if asked), its output captured."""
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        if torchrun
        else [sys.executable]
    )
    return subprocess.run(
        [*launcher, "-m", "hone.cli", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def ranks_run(tmp_path: Path, model_dir: Path, name: str, *, world: int = 2, **extra: object) -> Path:
    settings = {**STEPS, "trainer.world_size": world, **extra}
    done = hone_cli(["train", *tiny_overrides(tmp_path, model_dir, name, **settings)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / name


def critic_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    critic = run_dir / "checkpoints" / "step-3" / "critic"
    return {f"{f.name}/{k}": v for f in sorted(critic.glob("*.safetensors")) for k, v in load_file(f).items()}


def largest_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize(
    ("strategy", "extra", "torchrun"),
    [
        ("fsdp2", {}, False),
        ("ddp", {}, True),
        ("fsdp2", PPO, False),
        ("fsdp2", LORA, False),
        ("fsdp2", WARM, False),
        ("fsdp2", DISTILL, False),
    ],
    ids=["fsdp2", "ddp-torchrun", "fsdp2-ppo-critic", "fsdp2-lora", "fsdp2-sft-warm-start", "fsdp2-distill"],
)
def test_two_ranks_train_as_one_process(
    tmp_path: Path, micro_model_dir: Path, strategy: str, extra: dict[str, object], torchrun: bool
) -> None:
    train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "one", **(STEPS | extra))))
    overrides = STEPS | extra | {"trainer.strategy": strategy}
    if not torchrun:
        overrides["trainer.world_size"] = 2  # under torchrun: its WORLD_SIZE
    done = hone_cli(
        ["train", *tiny_overrides(tmp_path, micro_model_dir, "two", **overrides)], tmp_path, torchrun=torchrun
    )
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    start = {f"model.safetensors/{k}": v for k, v in load_file(micro_model_dir / "model.safetensors").items()}
    assert largest_gap({k: one[k] for k in start}, start) > 10 * TOLERANCE  # the runs trained
    if extra is WARM:
        # The SFT results agree to 1e-6, but the RL steps after them leave one element of an attention
        # output projection 1.7e-5 apart (measured): AdamW's g/sqrt(v) on a gradient near zero scales the
        # ranks' float reassociation up to a step of lr. Above the 1e-5 the other cases meet.
        sft = [load_file(tmp_path / run / "sft" / "model.safetensors") for run in ("one", "two")]
        assert largest_gap(*sft) <= TOLERANCE
        assert largest_gap(one, two) <= 3 * TOLERANCE
    else:
        assert largest_gap(one, two) <= TOLERANCE
    if extra is PPO:
        assert largest_gap(critic_weights(tmp_path / "one"), critic_weights(tmp_path / "two")) <= TOLERANCE
    if extra is DISTILL:  # the ranks' teacher scored what one process's did
        kl = [
            [row["distill/reverse_kl"] for row in map(json.loads, (tmp_path / run / "metrics.jsonl").open())
             if "distill/reverse_kl" in row]
            for run in ("one", "two")
        ]  # fmt: skip
        assert len(kl[0]) == 3 and kl[1] == pytest.approx(kl[0], abs=1e-4)
    if extra is LORA:  # the adapter as one process saves it, beside the merged weights
        assert any(k.startswith("adapter_model.safetensors/") and "lora_A" in k for k in two)
    assert "Traceback" not in done.stderr


def test_bf16_autocast_on_two_ranks_is_fsdp2_mixed_precision_and_moves_as_one_process(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """`trainer.autocast: bfloat16` on ranks is FSDP2's bf16 compute with fp32 reduction and masters; one
    process autocasts its matmuls. Not equal (FSDP2 casts every parameter, norms included), but the same
    update: the two runs' gap is a small fraction of how far either moved."""
    bf16 = {**STEPS, "trainer.autocast": "bfloat16", "run.steps": 1}  # one update of the same rollouts
    train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "one", **bf16)))
    two = ranks_run(tmp_path, micro_model_dir, "two", **bf16)
    start = {f"model.safetensors/{k}": v for k, v in load_file(micro_model_dir / "model.safetensors").items()}
    step = {}
    for name, run in (("one", tmp_path / "one"), ("two", two)):
        weights = final_weights(run, step=1)
        assert all(v.dtype == torch.float32 for v in weights.values())  # fp32 masters, saved as such
        step[name] = torch.cat([(weights[k] - start[k]).flatten() for k in sorted(start)])
    cosine = float(torch.nn.functional.cosine_similarity(step["one"], step["two"], dim=0))
    assert cosine > 0.9, cosine


def test_dpo_on_two_ranks_trains_as_one_process_and_evaluates_the_gathered_weights(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    # Batches of 5 pairs in micro-batches of 2: rank 0's 3 take 2 micro-batches, rank 1's 2 one and a pad.
    common = ["dpo.batch_size=5", "dpo.micro_batch_size=2", "trainer.collective_timeout_s=60"]
    assert main(dpo_args(tmp_path, micro_model_dir, "one", *common)) == 0
    args = dpo_args(tmp_path, micro_model_dir, "two", *common, "trainer.world_size=2")
    done = hone_cli(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    weights = [load_file(tmp_path / run / "model" / "model.safetensors") for run in ("one", "two")]
    start = load_file(micro_model_dir / "model.safetensors")
    assert largest_gap(weights[0], start) > 10 * TOLERANCE
    assert largest_gap(weights[0], weights[1]) <= TOLERANCE
    rows = [read_metrics(tmp_path / run / "metrics.jsonl") for run in ("one", "two")]
    assert [r["step"] for r in rows[1] if "eval/accuracy" in r] == [0, 6]  # rank 0 evaluated after, too
    losses = [[r["loss"] for r in run if "loss" in r] for run in rows]
    assert len(losses[1]) == 6 and max(abs(a - b) for a, b in zip(*losses, strict=True)) < 1e-5


def test_a_reward_model_on_two_ranks_trains_as_one_process(tmp_path: Path, micro_model_dir: Path) -> None:
    """`hone rm` on 2 ranks: batches of 5 pairs in micro-batches of 2 (rank 1 pads), the held-out pairs
    scored on every rank at each eval, the gathered model saved by rank 0."""
    args = [
        f"run.dir={tmp_path}",
        "run.threads=1",
        f"model.path={micro_model_dir}",
        f"rm.data={write_pairs(tmp_path / 'pairs.jsonl')}",
        "rm.steps=6",
        "rm.batch_size=5",
        "rm.micro_batch_size=2",
        "rm.eval_every=3",
        "rm.val_fraction=0.2",
        "rm.lr=1e-3",
        "logging.progress=false",
        "logging.tensorboard=false",
        "trainer.collective_timeout_s=60",
    ]
    assert main(["rm", "rm", "run.name=one", *args]) == 0
    done = hone_cli(["rm", "rm", "run.name=two", "trainer.world_size=2", *args], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    weights = [load_file(tmp_path / run / "model" / "model.safetensors") for run in ("one", "two")]
    assert largest_gap(weights[0], weights[1]) <= TOLERANCE
    rows = [read_metrics(tmp_path / run / "metrics.jsonl") for run in ("one", "two")]
    held_out = [[r["eval/pair_accuracy"] for r in run if "eval/pair_accuracy" in r] for run in rows]
    assert held_out[0] == held_out[1] and len(held_out[0]) == 2  # steps 3 and 6


def test_sft_on_two_ranks_trains_as_one_process_and_validates_on_rank_0(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    """`hone sft` on 2 ranks: batches of 5 in micro-batches of 2 (rank 1 pads), rank 0 validating the
    gathered weights every 2 steps; the SFT result equals one process's."""
    sft = {
        "sft.max_steps": 4,
        "sft.examples": 16,
        "sft.batch_size": 5,
        "sft.micro_batch_size": 2,
        "sft.val_size": 4,
        "sft.eval_every": 2,
        "trainer.collective_timeout_s": 60,
    }
    assert main(["sft", *tiny_overrides(tmp_path, micro_model_dir, "one", **sft)]) == 0
    args = tiny_overrides(tmp_path, micro_model_dir, "two", **sft, **{"trainer.world_size": 2})
    done = hone_cli(["sft", *args], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    weights = [load_file(tmp_path / run / "sft" / "model.safetensors") for run in ("one", "two")]
    start = load_file(micro_model_dir / "model.safetensors")
    assert largest_gap(weights[0], start) > 10 * TOLERANCE
    assert largest_gap(weights[0], weights[1]) <= TOLERANCE
    logs = [read_metrics(tmp_path / run / "sft" / "sft_log.jsonl") for run in ("one", "two")]
    evals = [[(r["step"], r["sft/eval"]) for r in log if "sft/eval" in r] for log in logs]
    assert evals[0] == evals[1] and [step for step, _ in evals[0]] == [2, 4]
    losses = [[r["sft/loss"] for r in log if "sft/loss" in r] for log in logs]
    assert max(abs(a - b) for a, b in zip(*losses, strict=True)) < 1e-5


def test_checkpoints_of_two_ranks_resume_exactly_and_at_another_world_size(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    straight = final_weights(ranks_run(tmp_path, micro_model_dir, "straight"))
    stopped = ranks_run(tmp_path, micro_model_dir, "stopped", **{"run.steps": 2})
    assert (stopped / "checkpoints" / "step-2" / "shards" / ".metadata").is_file()
    shutil.copytree(stopped, tmp_path / "to-one")
    again = hone_cli(["train", "--resume", str(stopped), "run.steps=3"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert largest_gap(final_weights(stopped), straight) == 0.0  # bit-identical

    one = hone_cli(
        ["train", "--resume", str(tmp_path / "to-one"), "run.steps=3", "trainer.world_size=1"], tmp_path
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert "written by 2 learner ranks, going on with 1" in one.stderr
    assert largest_gap(final_weights(tmp_path / "to-one"), straight) <= TOLERANCE

    train(
        load_config(None, tiny_overrides(tmp_path, micro_model_dir, "from-one", **{**STEPS, "run.steps": 2}))
    )
    two = hone_cli(
        ["train", "--resume", str(tmp_path / "from-one"), "run.steps=3", "trainer.world_size=2"], tmp_path
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert "written by 1 learner rank, going on with 2" in two.stderr
    assert largest_gap(final_weights(tmp_path / "from-one"), straight) <= TOLERANCE


def rank_processes(launcher: subprocess.Popen[str]) -> dict[int, int]:
    """The launcher's rank processes, {rank: pid}."""
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    found = {}
    for pid in map(int, children):
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        found[int(env[b"RANK"])] = pid
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def running_ranks(tmp_path: Path, model_dir: Path) -> tuple[subprocess.Popen[str], dict[int, int]]:
    """A long 2-rank run that has logged step 1, and its rank processes."""
    settings = {**STEPS, "run.steps": 10_000, "run.save_every": 0, "trainer.world_size": 2}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hone.cli", "train", *tiny_overrides(tmp_path, model_dir, "r", **settings)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "r" / "metrics.jsonl"
    reached = wait_for(lambda: 1 in logged_steps(metrics) or launcher.poll() is not None, 180)
    assert reached and launcher.poll() is None, launcher.stderr.read() if launcher.stderr else ""
    ranks = rank_processes(launcher)
    assert sorted(ranks) == [0, 1]
    return launcher, ranks


def test_a_killed_rank_ends_the_run_with_one_line_and_no_process_left(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    launcher, ranks = running_ranks(tmp_path, micro_model_dir)
    os.kill(ranks[1], signal.SIGKILL)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("hone: error: learner rank 1 of 2: died of SIGKILL; at step "), err
    # the run saves no checkpoint before run.save_every: it says how to go on from where it is
    assert (
        "resume with `hone train --resume" in last
        or "no checkpoint yet; the same command starts it again" in last
    )
    assert "Traceback" not in err
    assert not any(alive(pid) for pid in ranks.values())


def test_sigterm_on_the_launcher_stops_every_rank_within_10_s(tmp_path: Path, micro_model_dir: Path) -> None:
    launcher, ranks = running_ranks(tmp_path, micro_model_dir)
    sent = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert launcher.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].startswith("hone: interrupted at step "), err
    assert "Traceback" not in err
    assert not any(alive(pid) for pid in ranks.values())


def test_a_rank_that_fails_in_set_up_is_the_runs_one_line(tmp_path: Path, micro_model_dir: Path) -> None:
    bad = {"data.task": "null", "data.source": "nope.jsonl", "data.eval_source": "nope.jsonl"}
    done = hone_cli(
        [
            "train",
            *tiny_overrides(tmp_path, micro_model_dir, "bad", **STEPS, **bad, **{"trainer.world_size": 2}),
        ],
        tmp_path,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("hone: error: ") and "nope.jsonl" in lines[-1], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.world_size=2", "model.lora.r=4", "sft.enabled=true", "algorithm.kl.coef=0.1"],
            "with model.lora, sft.enabled and a KL reference is not supported",
        ),
        (["trainer.strategy=zero3"], "trainer.strategy"),
    ],
)
def test_what_ranks_cannot_do_yet_is_one_line_before_any_starts(
    overrides: list[str] | str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = ["train", *overrides] if isinstance(overrides, list) else [overrides, "trainer.world_size=2"]
    assert main([*command, f"run.dir={tmp_path}", "run.steps=0"]) == 2  # were it to start: nothing here
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.fixture(scope="module")
def vl_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hone.models.tiny_vl import build_tiny_vl_model

    return build_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl") / "m", num_layers=2)


@pytest.mark.parametrize("extra", [{}, PPO], ids=["grpo", "ppo-critic"])
def test_two_ranks_train_a_vision_model_as_one_process(
    tmp_path: Path, vl_model_dir: Path, extra: dict[str, object]
) -> None:
    """Image prompts on two ranks: each rank cuts its rows' images out of the batch (`VisionBatch.select`)
    for the old/reference log-probs, the critic's values and every micro-batch, as one process does."""
    vision = STEPS | extra | {"data.task": "vlm_count", "data.task_args": "{kinds: [count]}"}
    train(load_config(None, tiny_overrides(tmp_path, vl_model_dir, "one", **vision)))
    done = hone_cli(
        ["train", *tiny_overrides(tmp_path, vl_model_dir, "two", **vision, **{"trainer.world_size": 2})],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    start = {f"model.safetensors/{k}": v for k, v in load_file(vl_model_dir / "model.safetensors").items()}
    tower = [k for k in start if "/visual." in k]  # saved in the original checkpoint layout
    assert tower and largest_gap({k: one[k] for k in tower}, {k: start[k] for k in tower}) > 10 * TOLERANCE
    assert largest_gap(one, two) <= TOLERANCE
    if extra is PPO:
        assert largest_gap(critic_weights(tmp_path / "one"), critic_weights(tmp_path / "two")) <= TOLERANCE

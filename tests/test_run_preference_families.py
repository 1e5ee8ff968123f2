"""The run contract of the offline families (`hone sft`, `hone dpo`, `hone rm`): `--dry-run` checks and
writes nothing; `run.time_limit_s` stops and summarises; SIGTERM ends the run in one line with a checkpoint
that `--resume` finishes, bit for bit, as an unbroken run; and `fit`'s own checkpoint of an interrupt that
lands mid-step (deterministically, from the loss function)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from hone.cli import main
from hone.training import fit as fit_module
from hone.training.checkpoint import Checkpointer
from hone.training.fit import FitPlan, FitSaves, Stats, fit
from tests.helpers import assert_same_weights, dpo_args, write_jsonl
from tests.test_reward_model_training import rm_args

MODEL_OUT = {"sft": "sft", "dpo": "model", "rm": "model"}  # where each command saves its model


def sigterm_at_step_2(step: int, metrics: Mapping[str, float]) -> None:
    """A `run.callbacks` entry: SIGTERM, as a scheduler sends it, once step 2 is logged."""
    if step == 2:
        signal.raise_signal(signal.SIGTERM)


def sft_args(tmp_path: Path, model_dir: Path, name: str, *extra: str) -> list[str]:
    rows = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a in range(4) for b in range(3)]
    return [
        "sft",
        f"run.dir={tmp_path}",
        f"run.name={name}",
        "run.threads=1",
        "run.time_limit_s=null",
        f"model.path={model_dir}",
        f"sft.data={write_jsonl(tmp_path / 'demos.jsonl', rows)}",
        "sft.max_steps=4",
        "sft.batch_size=4",
        "sft.eval_every=2",
        "sft.val_size=2",
        "sft.stop_at_accuracy=null",
        "data.eval_size=2",
        "rollout.max_new_tokens=3",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.plot=[]",
        *extra,
    ]


def family_args(command: str, tmp_path: Path, model_dir: Path, name: str, *extra: str) -> list[str]:
    if command == "sft":
        return sft_args(tmp_path, model_dir, name, *extra)
    if command == "dpo":
        small = ["dpo.steps=4", "dpo.batch_size=3", "dpo.eval=false"]
        return dpo_args(tmp_path, model_dir, name, *small, *extra)
    return rm_args(tmp_path, model_dir, name, "rm.steps=4", "rm.eval_every=2", *extra)


@pytest.mark.parametrize("command", ["sft", "dpo", "rm"])
def test_dry_run_checks_and_writes_nothing(
    command: str, tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = family_args(
        command, tmp_path, micro_model_dir, "dry", *(["dpo.eval=true"] if command == "dpo" else [])
    )
    assert main([args[0], "--dry-run", *args[1:]]) == 0
    out = capsys.readouterr().out
    assert "nothing was trained or written" in out and "first" in out
    assert command != "dpo" or "held-out problems before and after DPO" in out
    assert not (tmp_path / "dry").exists()
    bad = [*args[1:], "model.path=/no/such/model"]
    assert main([args[0], "--dry-run", *bad]) == 2  # a start's refusal, one line
    assert not (tmp_path / "dry").exists()


@pytest.mark.parametrize("command", ["sft", "dpo", "rm"])
def test_time_limit_stops_and_summarises(command: str, tmp_path: Path, micro_model_dir: Path) -> None:
    """A budget spent before the first step: no step, the model saved and summary.json written."""
    args = family_args(command, tmp_path, micro_model_dir, "timed", "run.time_limit_s=0.001")
    assert main(args) == 0
    run = tmp_path / "timed"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["family"] == command and summary["steps"] == 0
    assert summary["model"] == str(run / MODEL_OUT[command])
    assert any((run / MODEL_OUT[command]).glob("*.safetensors"))


@pytest.mark.parametrize("command", ["sft", "dpo", "rm"])
def test_sigterm_leaves_a_checkpoint_that_resumes_bit_for_bit(
    command: str, tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # run.save_every=0: the only checkpoint is the one the interrupt writes
    assert main(family_args(command, tmp_path, micro_model_dir, "straight", "run.save_every=0")) == 0
    hook = "run.callbacks=[tests.test_run_preference_families:sigterm_at_step_2]"
    capsys.readouterr()
    args = family_args(command, tmp_path, micro_model_dir, "killed", "run.save_every=0", hook)
    assert main(args) == 128 + signal.SIGTERM
    run = tmp_path / "killed"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"hone: interrupted at step 2; last checkpoint step 2; resume with `hone {command} --resume {run}`"
    ]
    assert not (run / "summary.json").exists()
    assert main([command, "--resume", str(run), "run.callbacks=[]"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert_same_weights(tmp_path / "straight" / MODEL_OUT[command], run / MODEL_OUT[command])
    checkpoints = run / "checkpoints"
    steps = [load_file(str(checkpoints / f"step-{s}" / "model" / "model.safetensors")) for s in (2, 4)]
    assert any(not torch.equal(steps[0][k], steps[1][k]) for k in steps[0])  # steps 3-4 trained something
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_key = {"sft": "sft/loss", "dpo": "loss", "rm": "loss"}[command]
    assert [r["step"] for r in rows if train_key in r] == [1, 2, 3, 4]  # no step lost or logged twice


class _Weights:
    """A module as a checkpoint's `model/` part (safetensors, as `damage` expects)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def save_pretrained(self, directory: Path) -> None:
        from safetensors.torch import save_file

        directory.mkdir(parents=True)
        state = {k: v.contiguous() for k, v in self.module.state_dict().items()}
        save_file(state, directory / "w.safetensors")

    def load_weights(self, directory: Path) -> None:
        from safetensors.torch import load_file

        self.module.load_state_dict(load_file(directory / "w.safetensors"))


def _fit(
    tmp_path: Path, interrupt_at: int | None = None, resume: bool = False, deadline: float | None = None
) -> torch.nn.Module:
    """6 steps of a dropout MLP (the RNG matters) on 5 examples (epochs wrap mid-batch); with
    `interrupt_at`, a KeyboardInterrupt inside that step's second micro-batch forward."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    x, y = torch.randn(5, 3), torch.randn(5, 1)
    step = [0]

    def losses(indices: list[int], stats: Stats) -> Iterator[torch.Tensor]:
        step[0] += 1
        for k, i in enumerate(indices):
            if step[0] == interrupt_at and k == 1:
                raise KeyboardInterrupt
            loss = ((model(x[i]) - y[i]) ** 2).sum() / len(indices)
            stats.append({"loss": loss.detach().reshape(1)})
            yield loss

    checkpointer = Checkpointer(tmp_path)
    part = _Weights(model)
    latest = checkpointer.latest()
    if resume:
        assert latest is not None
        checkpointer.load(latest, {"model/": part})
    saves = FitSaves(
        save=checkpointer.save,
        model={"model/": part},
        every=4,
        restore=(lambda parts: checkpointer.load(latest, parts)) if resume else None,
    )
    plan = FitPlan(steps=6, batch_size=3, lr=1e-2, warmup_steps=2, schedule="cosine", seed=3)
    fit(
        model,
        list(model.parameters()),
        5,
        plan,
        losses,
        name="test",
        advice="",
        saves=saves,
        deadline=deadline,
    )
    return model


def test_an_interrupt_inside_a_step_saves_the_step_before_and_resume_is_exact(tmp_path: Path) -> None:
    straight = _fit(tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path / "killed", interrupt_at=3)
    assert Checkpointer(tmp_path / "killed").latest() == tmp_path / "killed" / "checkpoints" / "step-2"
    resumed = _fit(tmp_path / "killed", resume=True)
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    saved = sorted(p.name for p in (tmp_path / "straight" / "checkpoints").iterdir())
    assert saved == ["step-4", "step-6"]  # run.save_every and the last step


def test_a_deadline_between_steps_saves_the_last_step_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clock (read once before each step) passes the deadline before step 4: step 3 is saved, and a
    resume without the deadline ends where an unbroken run does."""
    ticks = iter(range(100))
    monkeypatch.setattr(fit_module, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    _fit(tmp_path / "timed", deadline=2.5)
    monkeypatch.undo()
    assert Checkpointer(tmp_path / "timed").latest() == tmp_path / "timed" / "checkpoints" / "step-3"
    resumed = _fit(tmp_path / "timed", resume=True)
    straight = _fit(tmp_path / "straight")
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)

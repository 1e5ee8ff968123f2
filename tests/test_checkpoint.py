"""Checkpointer: full-state round trip, atomic visibility, pruning and LoRA resume."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hone.training.checkpoint import Checkpointer, damage
from hone.training.policy import LoraSettings, Policy
from tests.conftest import tiny_qwen2


def _new_policy(seed: int) -> Policy:
    torch.manual_seed(seed)
    return Policy(tiny_qwen2(train_mode=True))


def _trainer(policy: Policy) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return opt, sched


def _train_steps(
    policy: Policy, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler
) -> None:
    ids = torch.randint(3, 32, (2, 6))
    for _ in range(3):
        lp, _ = policy.token_log_probs(ids, torch.ones_like(ids))
        (-lp.mean()).backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def _draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_save_load_restores_weights_optimizer_scheduler_rng_and_state(tmp_path: Path) -> None:
    policy = _new_policy(0)
    opt, sched = _trainer(policy)
    _train_steps(policy, opt, sched)
    ckpt = Checkpointer(tmp_path)
    path = ckpt.save(3, policy, opt, sched, {"data_position": 17, "buffer": [1, 2]})
    expected_draws = _draws()
    assert path == tmp_path / "checkpoints" / "step-3" == ckpt.latest()
    assert {p.name for p in path.iterdir()} == {
        "model",
        "optimizer.pt",
        "scheduler.pt",
        "rng.pt",
        "state.json",
    }
    assert (path / "model" / "model.safetensors").exists()

    fresh = _new_policy(1)  # different init, fresh optimizer state, scheduler at step 0
    fresh_opt, fresh_sched = _trainer(fresh)
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    extra = Checkpointer(tmp_path).load(path, fresh, fresh_opt, fresh_sched)

    assert extra == {"data_position": 17, "buffer": [1, 2], "step": 3}
    for (name, a), b in zip(
        policy.model.state_dict().items(), fresh.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    moments = [
        (opt.state[p], fresh_opt.state[q])
        for p, q in zip(policy.trainable_parameters(), fresh.trainable_parameters(), strict=True)
    ]
    assert all(
        torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
        for a, b in moments
    )
    assert fresh_sched.get_last_lr() == sched.get_last_lr() == [1e-2 / 4]
    assert fresh_opt.param_groups[0]["lr"] == pytest.approx(1e-2 / 4)
    a, b, c = _draws()
    assert (a, b) == expected_draws[:2] and torch.equal(c, expected_draws[2])


def test_leftover_temp_dirs_are_ignored_and_cleaned(tmp_path: Path) -> None:
    policy = _new_policy(0)
    opt, sched = _trainer(policy)
    ckpt = Checkpointer(tmp_path)
    assert ckpt.latest() is None
    ckpt.save(1, policy, opt, sched, {})
    # A save of step 2 killed mid-write, and a step dir without state.json: neither may be picked.
    half = tmp_path / "checkpoints" / ".tmp-step-2"
    (half / "model").mkdir(parents=True)
    (half / "state.json").write_text(json.dumps({"step": 2}))
    (tmp_path / "checkpoints" / "step-5").mkdir()
    assert ckpt.latest() == tmp_path / "checkpoints" / "step-1"
    ckpt.save(2, policy, opt, sched, {})
    assert ckpt.latest() == tmp_path / "checkpoints" / "step-2"
    assert (tmp_path / "checkpoints" / "step-2" / "model" / "config.json").exists()


def test_keep_last_prunes_oldest_and_resave_replaces(tmp_path: Path) -> None:
    policy = _new_policy(0)
    opt, sched = _trainer(policy)
    ckpt = Checkpointer(tmp_path, keep_last=2)
    for step in (10, 2, 30):  # ordering is numeric, not lexicographic
        ckpt.save(step, policy, opt, sched, {"tag": step})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-10", "step-30"]
    ckpt.save(30, policy, opt, sched, {"tag": "again"})
    assert json.loads((tmp_path / "checkpoints" / "step-30" / "state.json").read_text())["tag"] == "again"
    with pytest.raises(TypeError):
        ckpt.save(40, policy, opt, sched, {"bad": object()})
    assert ckpt.latest() == tmp_path / "checkpoints" / "step-30"


def test_lora_checkpoint_restores_adapter(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tiny_qwen2(train_mode=True).save_pretrained(tmp_path / "base")
    lora = LoraSettings(r=4, alpha=8)
    policy = Policy.from_pretrained(tmp_path / "base", lora=lora)
    opt, sched = _trainer(policy)
    _train_steps(policy, opt, sched)
    path = Checkpointer(tmp_path / "run").save(3, policy, opt, sched, {})
    assert (path / "model" / "adapter" / "adapter_model.safetensors").exists()

    fresh = Policy.from_pretrained(tmp_path / "base", lora=lora)
    fresh_opt, fresh_sched = _trainer(fresh)
    Checkpointer(tmp_path / "run").load(path, fresh, fresh_opt, fresh_sched)
    ids = torch.randint(3, 32, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(
            fresh.token_log_probs(ids, torch.ones_like(ids))[0],
            policy.token_log_probs(ids, torch.ones_like(ids))[0],
        )
    _train_steps(fresh, fresh_opt, fresh_sched)  # optimizer state maps onto the adapter params


def test_crash_mid_save_leaves_previous_checkpoint_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = _new_policy(0)
    opt, sched = _trainer(policy)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, policy, opt, sched, {})
    real_save = torch.save

    def dying_save(obj: object, f: Path) -> None:
        if Path(f).name == "rng.pt":
            raise KeyboardInterrupt  # the process dies after model/optimizer files were written
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(2, policy, opt, sched, {})
    assert (tmp_path / "checkpoints" / ".tmp-step-2" / "optimizer.pt").exists()
    assert ckpt.latest() == tmp_path / "checkpoints" / "step-1"


def _cut_short(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


@pytest.mark.parametrize(
    ("file", "problem"),
    [
        ("model/model.safetensors", "model/model.safetensors: "),
        ("optimizer.pt", "optimizer.pt: "),
        ("rng.pt", "rng.pt: "),
        ("state.json", "state.json: "),
    ],
)
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, file: str, problem: str
) -> None:
    policy = _new_policy(0)
    opt, sched = _trainer(policy)
    ckpt = Checkpointer(tmp_path)
    first, second = ckpt.save(1, policy, opt, sched, {}), ckpt.save(2, policy, opt, sched, {})
    assert damage(second) is None and ckpt.latest_intact() == second
    _cut_short(second / file)
    assert ckpt.latest() == second  # complete by name: only reading the files shows the damage
    assert ckpt.latest_intact() == first
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"checkpoint {second} is damaged ({problem}")
    assert warning.endswith("; trying the one before")
    _cut_short(first / file)
    with pytest.raises(ValueError, match=r"every checkpoint in .* is damaged"):
        ckpt.latest_intact()

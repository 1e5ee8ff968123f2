"""Checkpointer: full-state round trip, atomic visibility, pruning, LoRA resume; a run's checkpoints keep
their KL reference and survive non-finite gradients."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from hone.cli import main
from hone.config import load_config
from hone.rl import learner
from hone.rl.loop import SetupError, train
from hone.training.adapter_reference import AdapterReference
from hone.training.checkpoint import RNG, Checkpointer, Part, damage
from hone.training.models import load_reference
from hone.training.policy import LoraSettings, Policy, weights_digest
from tests.conftest import char_tokenizer, tiny_qwen2


def _new_policy(seed: int) -> Policy:
    torch.manual_seed(seed)
    return Policy(tiny_qwen2(train_mode=True), char_tokenizer())


def _trainer(policy: Policy) -> torch.optim.Optimizer:
    return torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)


def _train_steps(policy: Policy, opt: torch.optim.Optimizer) -> None:
    ids = torch.randint(3, 32, (2, 6))
    for _ in range(3):
        lp, _ = policy.token_log_probs(ids, torch.ones_like(ids))
        (-lp.mean()).backward()
        opt.step()
        opt.zero_grad()
    for group in opt.param_groups:  # as RLTrainer sets each step's LR: the group's lr is optimizer state
        group["lr"] = 1e-2 / 4


def _parts(policy: Policy, opt: torch.optim.Optimizer) -> dict[str, Part]:
    """The parts the loop saves of a policy: weights, optimizer and the RNG."""
    return {"model/": policy, "optimizer.pt": opt, "rng.pt": RNG}


def _draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_save_load_restores_weights_optimizer_rng_and_state(tmp_path: Path) -> None:
    policy = _new_policy(0)
    opt = _trainer(policy)
    _train_steps(policy, opt)
    ckpt = Checkpointer(tmp_path)
    path = ckpt.save(3, _parts(policy, opt) | {"data_position": 17, "buffer": [1, 2]})
    expected_draws = _draws()
    assert path == tmp_path / "checkpoints" / "step-3" == ckpt.latest()
    assert {p.name for p in path.iterdir()} == {
        "model",
        "optimizer.pt",
        "rng.pt",
        "state.json",
    }
    assert (path / "model" / "model.safetensors").exists()

    fresh = _new_policy(1)  # different init, fresh optimizer state and LR
    fresh_opt = _trainer(fresh)
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    extra = Checkpointer(tmp_path).load(path, _parts(fresh, fresh_opt))

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
    assert fresh_opt.param_groups[0]["lr"] == 1e-2 / 4
    a, b, c = _draws()
    assert (a, b) == expected_draws[:2] and torch.equal(c, expected_draws[2])


def test_leftover_temp_dirs_are_ignored_and_cleaned(tmp_path: Path) -> None:
    policy = _new_policy(0)
    opt = _trainer(policy)
    ckpt = Checkpointer(tmp_path)
    assert ckpt.latest() is None
    ckpt.save(1, _parts(policy, opt))
    # A save of step 2 killed mid-write, and a step dir without state.json: neither may be picked.
    half = tmp_path / "checkpoints" / ".tmp-step-2"
    (half / "model").mkdir(parents=True)
    (half / "state.json").write_text(json.dumps({"step": 2}))
    (tmp_path / "checkpoints" / "step-5").mkdir()
    assert ckpt.latest() == tmp_path / "checkpoints" / "step-1"
    ckpt.save(2, _parts(policy, opt))
    assert ckpt.latest() == tmp_path / "checkpoints" / "step-2"
    assert (tmp_path / "checkpoints" / "step-2" / "model" / "config.json").exists()


def test_keep_last_prunes_oldest_and_resave_replaces(tmp_path: Path) -> None:
    policy = _new_policy(0)
    opt = _trainer(policy)
    ckpt = Checkpointer(tmp_path, keep_last=2)
    for step in (10, 2, 30):  # ordering is numeric, not lexicographic
        ckpt.save(step, _parts(policy, opt) | {"tag": step})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-10", "step-30"]
    ckpt.save(30, _parts(policy, opt) | {"tag": "again"})
    assert json.loads((tmp_path / "checkpoints" / "step-30" / "state.json").read_text())["tag"] == "again"
    with pytest.raises(TypeError):
        ckpt.save(40, _parts(policy, opt) | {"bad": object()})
    assert ckpt.latest() == tmp_path / "checkpoints" / "step-30"


def test_lora_checkpoint_restores_adapter(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tiny_qwen2(train_mode=True).save_pretrained(tmp_path / "base")
    lora = LoraSettings(r=4, alpha=8)
    policy = Policy.from_pretrained(tmp_path / "base", lora=lora)
    opt = _trainer(policy)
    _train_steps(policy, opt)
    path = Checkpointer(tmp_path / "run").save(3, _parts(policy, opt))
    assert (path / "model" / "adapter" / "adapter_model.safetensors").exists()

    fresh = Policy.from_pretrained(tmp_path / "base", lora=lora)
    fresh_opt = _trainer(fresh)
    Checkpointer(tmp_path / "run").load(path, _parts(fresh, fresh_opt))
    ids = torch.randint(3, 32, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(
            fresh.token_log_probs(ids, torch.ones_like(ids))[0],
            policy.token_log_probs(ids, torch.ones_like(ids))[0],
        )
    _train_steps(fresh, fresh_opt)  # optimizer state maps onto the adapter params


def test_a_part_lives_where_its_name_says_and_a_missing_one_is_named(tmp_path: Path) -> None:
    class Counter:  # a JSON `Stateful`: its state goes into state.json under its name
        def __init__(self, n: int) -> None:
            self.n = n

        def state_dict(self) -> dict[str, int]:
            return {"n": self.n}

        def load_state_dict(self, state: dict[str, int]) -> None:
            self.n = state["n"]

    policy = _new_policy(0)
    opt = _trainer(policy)
    path = Checkpointer(tmp_path).save(2, _parts(policy, opt) | {"counter": Counter(7), "tag": "x"})
    assert json.loads((path / "state.json").read_text()) == {"counter": {"n": 7}, "tag": "x", "step": 2}
    restored = Counter(0)
    state = Checkpointer(tmp_path).load(path, {"counter": restored})
    assert restored.n == 7 and state["tag"] == "x"
    with pytest.raises(ValueError, match=r"holds no critic/ \(it was saved by a run without one\)"):
        Checkpointer(tmp_path).load(path, {"critic/": policy})
    with pytest.raises(ValueError, match=r"holds no 'trainer' in state.json"):
        Checkpointer(tmp_path).load(path, {"trainer": Counter(0)})


def test_crash_mid_save_leaves_previous_checkpoint_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = _new_policy(0)
    opt = _trainer(policy)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, _parts(policy, opt))
    real_save = torch.save

    def dying_save(obj: object, f: Path) -> None:
        if Path(f).name == "rng.pt":
            raise KeyboardInterrupt  # the process dies after model/optimizer files were written
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(2, _parts(policy, opt))
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
    opt = _trainer(policy)
    ckpt = Checkpointer(tmp_path)
    first, second = ckpt.save(1, _parts(policy, opt)), ckpt.save(2, _parts(policy, opt))
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


def _run(tmp_path: Path, model_dir: Path | str, **extra: object) -> list[str]:
    base = {
        "run.dir": str(tmp_path),
        "run.name": "run",
        "run.threads": 1,
        "run.time_limit_s": "null",
        "run.eval_every": 0,
        "run.save_every": 1,
        "model.path": str(model_dir),
        "data.eval_size": 4,
        "data.train_size": 16,
        "data.prompts_per_step": 2,
        "rollout.n": 2,
        "rollout.max_new_tokens": 3,
        "sft.enabled": "false",
        "logging.progress": "false",
        "logging.tensorboard": "false",
        "reward.fn": "tests.rewards_for_tests:token_id_reward",
        "algorithm.skip_zero_variance_groups": "false",
    }
    return [f"{k}={v}" for k, v in (base | extra).items()]


def _perturbed_copy(model_dir: Path, out: Path) -> Path:
    shutil.copytree(model_dir, out)
    weights = load_file(str(out / "model.safetensors"))
    save_file({k: v + 0.01 for k, v in weights.items()}, str(out / "model.safetensors"))
    return out


def test_a_resumed_run_refuses_a_different_kl_reference(tmp_path: Path, micro_model_dir: Path) -> None:
    other = _perturbed_copy(micro_model_dir, tmp_path / "other-model")
    train(load_config(None, _run(tmp_path, micro_model_dir, **{"run.steps": 1, "algorithm.kl.coef": 0.1})))
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-1" / "state.json").read_text())
    assert saved["reference"]["path"] == str(micro_model_dir) and len(saved["reference"]["sha256"]) == 64
    same = load_config(None, _run(tmp_path, micro_model_dir, **{"run.steps": 2, "algorithm.kl.coef": 0.1}))
    changed = same.model_copy(update={"model": same.model.model_copy(update={"path": str(other)})})
    with pytest.raises(SetupError, match=r"trained against the reference .* but this run's reference is"):
        train(changed, resume=True)
    assert load_config(tmp_path / "run" / "config.yaml").model.path == str(micro_model_dir)  # untouched
    assert train(same, resume=True).steps == 2  # the same reference resumes


def test_lora_reference_is_the_policy_itself_and_its_record_names_the_base(micro_model_dir: Path) -> None:
    cfg = load_config(None, ["model.lora.r=4", "model.lora.alpha=8", f"model.path={micro_model_dir}"])
    policy = Policy.from_pretrained(micro_model_dir, lora=LoraSettings(r=4, alpha=8))
    ref, record = load_reference(cfg.model, policy, str(micro_model_dir), warm_started=False)
    assert isinstance(ref, AdapterReference) and ref.model is policy.model and ref.adapter is None
    assert record == {"path": str(micro_model_dir), "sha256": weights_digest(ref.weights())}
    # The record is the base's content: training the adapter does not change it, a different base does.
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.add_(1.0)
    assert load_reference(cfg.model, policy, str(micro_model_dir), warm_started=False)[1] == record


def test_lora_reference_after_a_warm_start_is_the_sft_adapter(tmp_path: Path, micro_model_dir: Path) -> None:
    cfg = load_config(None, ["model.lora.r=4", "model.lora.alpha=8", f"model.path={micro_model_dir}"])
    policy = Policy.from_pretrained(micro_model_dir, lora=LoraSettings(r=4, alpha=8))
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.2)
    sft_dir = policy.save_pretrained(tmp_path / "sft")  # what a warm start leaves
    ids = torch.randint(3, 200, (2, 7))
    with torch.no_grad():
        at_sft, _ = policy.token_log_probs(ids, torch.ones_like(ids))
        ref, record = load_reference(cfg.model, policy, str(sft_dir), warm_started=True)
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.add_(0.5)  # RL moves the adapter on; the reference stays at the SFT adapter
        torch.testing.assert_close(ref.token_log_probs(ids, torch.ones_like(ids))[0], at_sft, rtol=0, atol=0)
    assert record["path"] == str(sft_dir) and ref.model is policy.model


def test_nonfinite_gradients_stop_the_run_in_one_line_with_the_checkpoint_intact(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = learner.compute_advantages

    def nan_from_step_2(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        advantages, returns, metrics = real(*args, **kwargs)
        if nan_from_step_2.calls:
            advantages = advantages * float("nan")
        nan_from_step_2.calls += 1
        return advantages, returns, metrics

    nan_from_step_2.calls = 0  # type: ignore[attr-defined]
    monkeypatch.setattr(learner, "compute_advantages", nan_from_step_2)
    code = main(
        ["train", *_run(tmp_path, micro_model_dir, **{"run.steps": 5, "trainer.max_nonfinite_steps": 2})]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("hone: error: stopped at RL step 3: the gradient norm was nan")
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints[-1] == "step-2"  # step 2 skipped its update (finite weights saved), step 3 stopped
    weights = load_file(str(tmp_path / "run" / "checkpoints" / "step-2" / "model" / "model.safetensors"))
    assert all(bool(torch.isfinite(v).all()) for v in weights.values())


def test_a_checkpoint_from_the_optimizer_step_lr_clock_is_refused_in_one_line(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    train(load_config(None, _run(tmp_path, micro_model_dir, **{"run.steps": 1})))
    step = tmp_path / "run" / "checkpoints" / "step-1"
    assert not (step / "scheduler.pt").exists()  # nothing writes it any more
    # What an older hone left: a LambdaLR state whose warm-up counted optimizer steps, no LR progress.
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    torch.save(torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0).state_dict(), step / "scheduler.pt")
    state = json.loads((step / "state.json").read_text())
    del state["trainer"]["lr_progress"]
    (step / "state.json").write_text(json.dumps(state))
    resumed = load_config(None, _run(tmp_path, micro_model_dir, **{"run.steps": 2}))
    with pytest.raises(SetupError, match=r"older hone whose LR schedule counted optimizer steps .* delete"):
        train(resumed, resume=True)
    (step / "scheduler.pt").unlink()  # the way out the message names: accept the RL-step schedule
    assert train(resumed, resume=True).steps == 2

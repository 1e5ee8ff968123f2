"""On-policy distillation (`distill`): the per-token reverse-KL advantage against hand-computed values, its
sum with GRPO's, the config's rules, the tokenizer check, and a tiny student moving toward its teacher."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hone.algorithms.distill import DISTILL_MODES, distill_advantages
from hone.config import AlgorithmConfig, ConfigError, DistillConfig, load_config
from hone.rl.loop import train
from hone.run.lifecycle import SetupError
from hone.training.advantages import compute_advantages
from hone.training.models import check_same_vocab
from hone.types import Rollout
from tests.conftest import char_tokenizer, tiny_qwen2
from tests.helpers import tiny_overrides

STUDENT = torch.tensor([[-1.0, -2.0, -0.5], [-0.25, -3.0, 0.0]])
TEACHER = torch.tensor([[-1.5, -0.5, -0.5], [-1.0, -1.0, -7.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # row 1's last position is padding


def test_reverse_kl_advantages_by_hand() -> None:
    # k = student - teacher on the 5 response tokens: 0.5, -1.5, 0.0 | 0.75, -2.0 (the pad's 7.0 is not read)
    advantages, metrics = distill_advantages("reverse_kl", STUDENT, TEACHER, MASK, 2.0)
    expected = torch.tensor([[-1.0, 3.0, 0.0], [-1.5, 4.0, 0.0]])  # -coef * k, 0 on padding
    assert torch.equal(advantages, expected)
    assert metrics == {"distill/reverse_kl": pytest.approx((0.5 - 1.5 + 0.0 + 0.75 - 2.0) / 5)}
    assert set(DISTILL_MODES) == {"reverse_kl"}


def _rollouts(rewards: list[float]) -> list[Rollout]:
    """A group of rollouts shaped as MASK: three response tokens, then two."""
    return [
        Rollout(
            sample_id="s",
            group_id="g",
            token_ids=[5] + [6] * n,
            prompt_len=1,
            loss_mask=[1] * n,
            sampler_logprobs=[0.0] * n,
            reward=r,
        )
        for r, n in zip(rewards, (3, 2), strict=True)
    ]


def test_distillation_adds_to_the_grpo_advantage() -> None:
    # One group of two, rewards 1 and 0: GRPO's advantage is ±(0.5 / std) with the unbiased std √0.5.
    rollouts = _rollouts([1.0, 0.0])
    group_ids = torch.tensor([0, 0])
    algo = AlgorithmConfig(advantage="grpo")
    advantages = functools.partial(
        compute_advantages, rollouts, algo, response_mask=MASK, old_logp=STUDENT, group_ids=group_ids
    )
    grpo, _, plain = advantages()
    a = 0.5 / (math.sqrt(0.5) + algo.eps)
    assert torch.allclose(grpo, torch.tensor([[a, a, a], [-a, -a, 0.0]]))
    assert "distill/reverse_kl" not in plain
    both, _, metrics = advantages(teacher_logp=TEACHER, distill=DistillConfig(teacher="t", coef=2.0))
    distill = torch.tensor([[-1.0, 3.0, 0.0], [-1.5, 4.0, 0.0]])
    assert torch.allclose(both, grpo + distill)
    assert metrics["distill/reverse_kl"] == pytest.approx(-0.45)
    alone, returns, metrics = advantages(
        teacher_logp=TEACHER, distill=DistillConfig(teacher="t", coef=2.0, reward=False)
    )
    assert torch.equal(alone, distill) and torch.equal(returns, torch.zeros_like(distill))
    assert metrics == {"distill/reverse_kl": pytest.approx(-0.45)}


def test_distill_config_rules() -> None:
    cfg = load_config(None, ["distill.teacher=tiny"])
    assert (cfg.distill.coef, cfg.distill.mode, cfg.distill.reward) == (1.0, "reverse_kl", True)
    with pytest.raises(ConfigError, match="mode"):
        load_config(None, ["distill.teacher=tiny", "distill.mode=forward_kl"])
    # The default recipe drops equal-reward groups: distillation alone must train on every group.
    with pytest.raises(ConfigError, match="skip_zero_variance_groups: false"):
        load_config(None, ["distill.teacher=tiny", "distill.reward=false"])
    load_config(
        None, ["distill.teacher=tiny", "distill.reward=false", "algorithm.skip_zero_variance_groups=false"]
    )


def test_tokenizer_mismatch_is_one_line(tmp_path: Path, micro_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="different tokenizer") as e:
        check_same_vocab(char_tokenizer("ab"), char_tokenizer("abc"), "student-x", "teacher-y")
    assert "student-x" in str(e.value) and "teacher-y" in str(e.value) and "\n" not in str(e.value)
    check_same_vocab(char_tokenizer("ab"), char_tokenizer("ab"), "s", "t")
    # A run whose teacher has another tokenizer stops at set-up, naming both models, before any training.
    torch.manual_seed(0)
    teacher = tmp_path / "char-teacher"
    tiny_qwen2(vocab_size=40).save_pretrained(teacher)
    char_tokenizer().save_pretrained(teacher)
    overrides = tiny_overrides(tmp_path, micro_model_dir, "mismatch", **{"distill.teacher": teacher})
    with pytest.raises(SetupError) as e:
        train(load_config(None, overrides))
    message = str(e.value)
    assert "\n" not in message and str(teacher) in message and str(micro_model_dir) in message
    assert not (tmp_path / "mismatch" / "checkpoints").exists()


def _sharpened(model_dir: Path, out: Path, scale: float) -> Path:
    """`model_dir`'s model with its final norm's weight scaled: logits `scale` times larger, a peaked
    distribution over the same ranking (a teacher the student can reach by sharpening)."""
    out.mkdir()
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(model_dir / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * scale
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_student_moves_toward_teacher(tmp_path: Path, micro_model_dir: Path) -> None:
    # The teacher is the student with 8x its logits: the same preferences, sharper. Distillation alone
    # (no reward in the advantage) must sharpen the student: the sampled reverse KL falls.
    teacher = _sharpened(micro_model_dir, tmp_path / "teacher", 8.0)
    settings = {
        "run.steps": 30,
        "run.save_every": 0,
        "run.eval_every": 0,
        "data.prompts_per_step": 16,
        "rollout.max_new_tokens": 2,
        "distill.teacher": teacher,
        "distill.reward": "false",
        "trainer.lr": 1e-2,
    }
    result = train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "opd", **settings)))
    # The random student answers nothing right (every reward 0), yet every step had the teacher's signal.
    assert (result.tally.updated, result.tally.no_signal) == (30, 0)
    rows = [json.loads(line) for line in (tmp_path / "opd" / "metrics.jsonl").read_text().splitlines()]
    kl = [r["distill/reverse_kl"] for r in rows if "distill/reverse_kl" in r]
    assert len(kl) == 30
    first, last = sum(kl[:5]) / 5, sum(kl[-5:]) / 5
    assert first > 1.0 and last < 0.6 * first, kl  # ~2.1 → ~0.8

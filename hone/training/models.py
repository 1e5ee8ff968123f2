"""Loading the trainable side's models from the `model` (and `critic`) section: the policy, the frozen
reference where RL started, PPO's value model, and the checks that a model and tokenizer are usable
before anything trains."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file

from hone.models import resolve_model
from hone.models.tokens import pad_token_id
from hone.training.adapter_reference import AdapterReference
from hone.training.critic import ValueModel
from hone.training.policy import ADAPTER_DIR, DType, LoraSettings, Policy, weights_digest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from hone.config import CriticConfig, DistillConfig, ModelConfig

__all__ = [
    "check_same_vocab",
    "check_teacher_tokenizer",
    "check_tokenizer",
    "load_critic",
    "load_policy",
    "load_reference",
    "load_teacher",
    "pad_token_id",
]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_policy(model: ModelConfig, path: str) -> Policy:
    """The trainable policy from `path` (a resolved `model.path`, or a run's SFT result), with the
    section's dtype, LoRA, gradient checkpointing and device."""
    lora = model.lora
    return Policy.from_pretrained(
        path,
        dtype=model.dtype,
        lora=None if lora is None else LoraSettings(lora.r, lora.alpha, lora.dropout, lora.target_modules),
        gradient_checkpointing=model.gradient_checkpointing,
        device=model.device,
        freeze_vision=model.freeze_vision,
    )


def load_reference(
    model: ModelConfig, policy: Policy, start_dir: str, *, warm_started: bool
) -> tuple[Policy, dict[str, str]]:
    """The frozen policy where RL started (the SFT result of a warm start), and its record for checkpoints:
    `{"path": start_dir, "sha256": weights_digest}`, so a resumed run can refuse a different reference.

    With LoRA it is the policy's own model, no second copy: the base with the adapter disabled, or, after
    a warm start (which trained the adapter), the base with the SFT adapter swapped in. Otherwise a frozen
    copy loaded from `start_dir`.
    """
    if policy.is_lora:
        adapter = None
        if warm_started:
            adapter_file = Path(start_dir) / ADAPTER_DIR / "adapter_model.safetensors"
            adapter = load_file(adapter_file, device=str(policy.device))
        adapter_ref = AdapterReference(policy, adapter)
        ref: Policy = adapter_ref
        tensors = adapter_ref.weights()
    else:
        ref = load_policy(model, start_dir)
        ref.model.eval().requires_grad_(False)
        tensors = ref.model.state_dict()
    return ref, {"path": str(start_dir), "sha256": weights_digest(tensors)}


def check_same_vocab(
    student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, student_name: str, teacher_name: str
) -> None:
    """Refuse a teacher whose tokenizer is not the student's: on-policy distillation reads the teacher's
    log-prob of the student's token ids, which means the same thing only under the same vocabulary (the
    same token → id map and the same special tokens)."""
    if student.get_vocab() != teacher.get_vocab() or student.all_special_tokens != teacher.all_special_tokens:
        raise ValueError(
            f"distill.teacher {teacher_name} has a different tokenizer from the student {student_name} "
            f"({len(teacher)} vs {len(student)} tokens): on-policy distillation needs the same vocabulary"
        )


def check_teacher_tokenizer(
    distill: DistillConfig, student: PreTrainedTokenizerBase, student_name: str
) -> None:
    """`check_same_vocab` on `distill.teacher`'s tokenizer alone (the teacher's weights load later, on the
    learner): a mismatch fails at set-up, before an SFT warm start or any sampling."""
    from transformers import AutoTokenizer

    assert distill.teacher is not None
    path = resolve_model(distill.teacher, what="distill.teacher")
    check_same_vocab(student, AutoTokenizer.from_pretrained(path), student_name, distill.teacher)


def load_teacher(distill: DistillConfig, model: ModelConfig, policy: Policy) -> Policy:
    """The frozen teacher of on-policy distillation, from `distill.teacher` (what `model.path` accepts), in
    `model.dtype` on the policy's device, served as the KL reference is: beside the policy on every
    learner rank. Its tokenizer must be the policy's (`check_same_vocab`)."""
    assert distill.teacher is not None
    path = resolve_model(distill.teacher, what="distill.teacher")
    teacher = Policy.from_pretrained(path, dtype=model.dtype, device=str(policy.device))
    teacher.model.eval().requires_grad_(False)
    check_same_vocab(policy.tokenizer, teacher.tokenizer, model.path, distill.teacher)
    return teacher


def load_critic(critic: CriticConfig, policy: Policy, start_dir: str, *, dtype: DType) -> ValueModel:
    """PPO's value model: the trunk of `critic.path` (a saved critic keeps its head), or by default of the
    policy where RL starts (`start_dir`: the SFT result after a warm start), with a new value head. A LoRA
    policy's start directory holds merged weights, so the critic is always a full model. `dtype` is
    `model.dtype`: the critic computes in the policy's precision."""
    path = resolve_model(critic.path) if critic.path is not None else start_dir
    return ValueModel.from_pretrained(path, dtype=dtype, device=policy.device)


def check_tokenizer(policy: Policy, model_path: str) -> None:
    """Refuse a model/tokenizer pair the sampler cannot use. transformers loads a directory without
    tokenizer files as an empty tokenizer (text encodes to no tokens), which would only fail at the
    first generate call, after the model loaded and an eval ran."""
    tokenizer = policy.tokenizer
    if tokenizer is None:
        raise ValueError(f"model {model_path}: no tokenizer loaded with the model")
    if not tokenizer("The answer is 42.", add_special_tokens=False)["input_ids"]:
        local = Path(model_path)
        found = [f for f in TOKENIZER_FILES if (local / f).is_file()] if local.is_dir() else []
        files = f"; it has {', '.join(found)}" if found else f"; it has none of {', '.join(TOKENIZER_FILES)}"
        raise ValueError(f"model {model_path}: no usable tokenizer (text encodes to no tokens){files}")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"model {model_path}: the tokenizer defines no eos_token, so no response can end")
    weight = getattr(policy.model.get_input_embeddings(), "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"model {model_path}: its input embeddings hold no weight matrix")
    rows = weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(
            f"model {model_path}: the tokenizer has {len(tokenizer)} tokens but the model embeds only {rows}"
        )

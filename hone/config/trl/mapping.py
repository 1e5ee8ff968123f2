"""TRL's `GRPOConfig` (and the `trl grpo` script's model, dataset and reward arguments) as a Hone recipe.

`translate(values, defaults)` reads every field of a TRL config: `values` holds the fields the user set
(a value other than TRL's default counts as set) and `defaults` TRL's own for every field. A field that
changes training is mapped to the Hone keys that do its job, with TRL's value even when it is TRL's
default (a script that leaves `learning_rate` alone trains at TRL's 1e-6, not Hone's 1e-4). A field
Hone has no use for (where logs go, data-loader workers) is noted when set. A field that would change
training in a way Hone cannot reproduce is refused, by name and with the reason, when the user set it:
never silently ignored. A field this table does not know is refused when set too, so a TRL release's
new option cannot slip past.

TRL counts optimizer steps (`max_steps`, `save_steps`, `warmup_steps`), Hone counts RL steps (one
generated batch each): one generation serves `steps_per_generation * num_iterations /
gradient_accumulation_steps` optimizer steps, and step counts are divided by that.

Leaf module: no TRL import (`hone.trl.trainer` and `hone.cli.trl_config` read TRL's classes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hone.config.trl.handlers as h
from hone.config import ConfigError
from hone.config.trl.args import Translation, TrlArgs

Handler = Callable[[Any, TrlArgs, Translation], None]


def _to(key: str, convert: Callable[[Any], Any] = lambda v: v) -> Handler:
    return lambda v, a, t: t.set(key, convert(v))


def _refuse(reason: str) -> Handler:
    """Refused when set (away from TRL's default): Hone cannot do what it asks."""

    def handle(v: Any, a: TrlArgs, t: Translation) -> None:
        if a.set_by_user(a.field):
            t.refused.append(f"{a.field}={v!r} ({reason})")

    return handle


def _no_effect(reason: str) -> Handler:
    """Said once when set: the field changes nothing Hone trains."""

    def handle(v: Any, a: TrlArgs, t: Translation) -> None:
        if a.set_by_user(a.field):
            t.notes.append(f"{a.field}={v!r}: {reason}")

    return handle


_CONSUMED = ""  # handled by another field's handler

HANDLERS: dict[str, Handler | str] = {
    # the script's data and rewards
    "dataset_name": h.dataset,
    "dataset_config": _CONSUMED,
    "dataset_test_split": _CONSUMED,
    "datasets": _CONSUMED,
    "reward_funcs": h.rewards,
    "reward_model_name_or_path": _CONSUMED,
    "reward_weights": _CONSUMED,
    # the model
    "model_name_or_path": h.model,
    "dtype": h.dtype,
    "use_peft": h.peft,
    "lora_r": _CONSUMED,
    "lora_alpha": _CONSUMED,
    "lora_dropout": _CONSUMED,
    "lora_target_modules": _CONSUMED,
    "gradient_checkpointing": _to("model.gradient_checkpointing", bool),
    "disable_dropout": _to("trainer.disable_dropout", bool),
    "use_cpu": lambda v, a, t: t.set("model.device", "cpu") if v else None,
    # sampling
    "num_generations": h.batch,
    "per_device_train_batch_size": _CONSUMED,
    "gradient_accumulation_steps": _CONSUMED,
    "generation_batch_size": _CONSUMED,
    "steps_per_generation": _CONSUMED,
    "max_completion_length": _to("rollout.max_new_tokens", int),
    "temperature": _to("rollout.temperature", float),
    "top_p": _to("rollout.top_p", float),
    "top_k": _to("rollout.top_k", lambda v: int(v or 0)),
    "use_vllm": h.vllm,
    "vllm_mode": _CONSUMED,
    "vllm_importance_sampling_correction": _CONSUMED,
    "vllm_importance_sampling_mode": _CONSUMED,
    "vllm_importance_sampling_clip_max": _CONSUMED,
    "vllm_importance_sampling_clip_min": _CONSUMED,
    "vllm_importance_sampling_cap": _CONSUMED,
    "max_tool_calling_iterations": h.tool_iterations,
    # the objective
    "loss_type": h.loss_type,
    "epsilon": h.clip,
    "epsilon_high": _CONSUMED,
    "delta": lambda v, a, t: t.set("algorithm.dual_clip", float(v)) if v is not None else None,
    "scale_rewards": h.scale_rewards,
    "importance_sampling_level": h.importance_level,
    "beta": h.beta,
    "num_iterations": _to("trainer.ppo_epochs", int),
    "mask_truncated_completions": _to("algorithm.mask_truncated", bool),
    "entropy_coef": _to("algorithm.entropy_coef", float),
    # the optimizer
    "learning_rate": _to("trainer.lr", float),
    "lr_scheduler_type": h.schedule,
    "warmup_steps": _CONSUMED,
    "warmup_ratio": _CONSUMED,
    "weight_decay": _to("trainer.weight_decay", float),
    "adam_beta1": lambda v, a, t: t.set("trainer.betas", [float(v), float(a["adam_beta2"])]),
    "adam_beta2": _CONSUMED,
    "max_grad_norm": _to("trainer.grad_clip", lambda v: float(v) if v and v > 0 else None),
    "optim": h.optim,
    "bf16": h.bf16,
    "fp16": _CONSUMED,
    # the run
    "max_steps": h.steps,
    "num_train_epochs": _CONSUMED,
    "seed": _to("run.seed", int),
    "output_dir": h.output_dir,
    "save_strategy": h.save,
    "save_steps": _CONSUMED,
    "save_total_limit": lambda v, a, t: t.set("run.keep_last", int(v)) if v else None,
    "eval_strategy": h.eval,
    "eval_steps": _CONSUMED,
    "num_generations_eval": _CONSUMED,
    "report_to": h.report_to,
    "log_completions": h.completions,
    "num_completions_to_print": _CONSUMED,
    # refused when they would change training
    "adam_epsilon": _refuse("Hone's AdamW eps is torch's 1e-8"),
    "sync_ref_model": _refuse("TR-DPO's moving reference model is not in Hone"),
    "top_entropy_quantile": _refuse("training on high-entropy tokens only is not in Hone"),
    "use_adaptive_entropy": _refuse("an adaptive entropy coefficient is not in Hone"),
    "multi_objective_aggregation": _refuse(
        "Hone sums weighted rewards, then normalises (GDPO's normalize_then_sum is not in Hone)"
    ),
    "min_p": _refuse("Hone's samplers take temperature, top_p and top_k"),
    "repetition_penalty": _refuse("a repetition penalty would make the sampler's policy not the trained one"),
    "generation_kwargs": _refuse("Hone's sampling keys are rollout.temperature/top_p/top_k/stop"),
    "chat_template_kwargs": _refuse("Hone renders prompts with the template's defaults"),
    "trust_remote_code": _refuse("Hone loads models without remote code"),
    "model_revision": _refuse("Hone loads a model's default revision: give a local copy"),
    "load_in_4bit": _refuse("Hone has no quantised (QLoRA) training"),
    "load_in_8bit": _refuse("Hone has no quantised (QLoRA) training"),
    "use_rslora": _refuse("Hone's LoRA scale is alpha / r"),
    "use_dora": _refuse("DoRA is not in Hone"),
    "use_liger_kernel": _refuse("Liger kernels are not in Hone"),
    "torch_compile": _refuse("Hone does not compile the model"),
    "cast_lm_head_to_fp32": _refuse("Hone's fp32 head is model.dtype=float32"),
    "off_policy_mask_threshold": _refuse("Hone's off-policy masks are algorithm.off_policy"),
    "push_to_hub": _refuse("Hone does not push to the hub; the model is in runs/<name>"),
    "log_completions_hub_repo": _refuse("Hone does not push to the hub"),
    "shuffle_dataset": _refuse("Hone always draws prompts in a seeded shuffle (data.scheduler)"),
    "dataset_streaming": _refuse("Hone reads the whole dataset at the start"),
    "dataset_train_split": _refuse("Hone trains on a dataset's 'train' split"),
    "resume_from_checkpoint": _refuse("resume a Hone run with hone train --resume runs/<name>"),
    "deepspeed": _refuse("Hone's ranks are FSDP2/DDP: trainer.world_size, trainer.strategy"),
    "fsdp": _refuse("Hone's ranks are FSDP2/DDP: trainer.world_size, trainer.strategy"),
    "router_aux_loss_coef": _refuse("a mixture-of-experts router loss is not in Hone"),
    "auto_find_batch_size": _refuse("TRL refuses it for GRPO too"),
    # no effect on what is trained
    "logging_steps": _no_effect("Hone logs every RL step to metrics.jsonl"),
    "logging_dir": _no_effect("Hone's logs are in runs/<name>"),
    "logging_strategy": _no_effect("Hone logs every RL step"),
    "logging_first_step": _no_effect("Hone logs every RL step"),
    "log_level": _no_effect("Hone logs at INFO"),
    "disable_tqdm": _no_effect("Hone's progress is logging.progress"),
    "run_name": _no_effect("the run is named after output_dir (run.name)"),
    "remove_unused_columns": _no_effect("every column reaches the reward functions, as in TRL's GRPO"),
    "dataloader_num_workers": _no_effect("Hone reads the dataset once, at the start"),
    "dataloader_pin_memory": _no_effect("Hone reads the dataset once, at the start"),
    "dataloader_drop_last": _no_effect("Hone draws whole steps of prompts"),
    "attn_implementation": _no_effect("Hone uses transformers' default attention (sdpa)"),
    "pad_to_multiple_of": _no_effect("Hone pads micro-batches to their longest sequence"),
    "per_device_eval_batch_size": _no_effect("Hone's eval batches are rollout.max_batch_size"),
    "log_multimodal": _no_effect("Hone logs image prompts by reference"),
    "log_unique_prompts": _no_effect("Hone logs logging.samples completions per step"),
    "overwrite_output_dir": _no_effect("an existing run directory is refused unless --resume"),
    "save_safetensors": _no_effect("Hone saves safetensors"),
    "vllm_gpu_memory_utilization": _no_effect(
        "Hone's vLLM engine sizes its own cache (rollout.vllm_kv_cache_gib on CPU)"
    ),
    "ds3_gather_for_generation": _no_effect("Hone's sampler holds full weights"),
}


def translate(
    values: dict[str, Any],
    defaults: dict[str, Any],
    *,
    train_rows: int | None = None,
    env_rewards: bool = False,
) -> Translation:
    """The Hone recipe for a TRL config: `values` every field's value, `defaults` TRL's (a field whose
    value differs from its default is one the user set), `train_rows` the training set's length (for
    `num_train_epochs`), `env_rewards` whether an environment scores episodes (then no reward function
    is needed). Raises `ConfigError` naming every field Hone cannot honour, in one line."""
    args = TrlArgs({**defaults, **values}, defaults, train_rows, env_rewards)
    out = Translation()
    for name in sorted(args.values, key=_order):
        handler = HANDLERS.get(name)
        args.field = name
        if handler is None:  # a field this table does not know: refused only when set
            if args.set_by_user(name):
                out.refused.append(f"{name}={args.values[name]!r} (no Hone equivalent)")
        elif not isinstance(handler, str):  # a string: another field's handler reads it
            handler(args.values[name], args, out)
    if out.refused:
        raise ConfigError("TRL settings Hone cannot honour: " + "; ".join(out.refused))
    return out


_FIRST = ("num_generations", "loss_type")  # the batch shape and the loss before what reads them


def _order(name: str) -> tuple[int, str]:
    return (0 if name in _FIRST else 1, name)

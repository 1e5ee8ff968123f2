"""The handlers of TRL fields that need more than one Hone key (`mapping.HANDLERS` names them): each
reads the field's value and its neighbours and writes Hone keys, notes or refusals."""

from __future__ import annotations

import math
from typing import Any

from hone.config.trl.args import Translation, TrlArgs

# --- the batch shape ----------------------------------------------------------------------------------


def optimizer_steps_per_generation(a: TrlArgs) -> float:
    return (
        float(a["steps_per_generation"])
        * float(a["num_iterations"])
        / float(a["gradient_accumulation_steps"])
    )


def batch(v: Any, a: TrlArgs, t: Translation) -> None:
    """`num_generations` and TRL's batch fields: Hone's prompts per step, mini-batches and micro-batch."""
    n = int(a["num_generations"])
    per_device, accumulation = int(a["per_device_train_batch_size"]), int(a["gradient_accumulation_steps"])
    completions, spg = a["generation_batch_size"], a["steps_per_generation"]
    if completions is None and spg is None:  # GRPOConfig.__post_init__'s defaults, on one process
        spg = accumulation
    if completions is None:
        completions = per_device * int(spg)
    elif spg is None:
        spg = int(completions) // per_device
    a.values["steps_per_generation"] = spg
    if int(completions) % n:
        t.refused.append(
            f"generation_batch_size={completions} (per_device_train_batch_size x steps_per_generation) is "
            f"not a multiple of num_generations={n}: Hone samples whole groups"
        )
        return
    t.set("rollout.n", n)
    t.set("data.prompts_per_step", int(completions) // n)
    t.set("trainer.micro_batch_size", per_device)
    if int(spg) % accumulation:
        t.refused.append(
            f"steps_per_generation={spg} is not a multiple of gradient_accumulation_steps={accumulation}: "
            "Hone takes whole optimizer steps on each generated batch"
        )
        return
    t.set("trainer.mini_batches", int(spg) // accumulation)
    if accumulation > 1:
        t.notes.append(
            f"gradient_accumulation_steps={accumulation}: Hone accumulates by trainer.micro_batch_size "
            f"({per_device}) and trainer.micro_batch_tokens; the loss is the same"
        )


def rl_steps(optimizer_steps: float, a: TrlArgs) -> int:
    return max(1, math.ceil(optimizer_steps / optimizer_steps_per_generation(a)))


def steps(v: Any, a: TrlArgs, t: Translation) -> None:
    """`max_steps` (optimizer steps) in RL steps; without it, `num_train_epochs` passes over the rows."""
    if int(a["max_steps"]) > 0:
        t.set("run.steps", rl_steps(int(a["max_steps"]), a))
        return
    rows = a.train_rows
    if rows is None:
        t.refused.append(
            f"max_steps={a['max_steps']}: TRL then trains num_train_epochs={a['num_train_epochs']} passes "
            "over the dataset, whose length is not known here; set max_steps"
        )
        return
    prompts = int(t.get("data.prompts_per_step", 1))
    t.set("run.steps", max(1, math.ceil(float(a["num_train_epochs"]) * int(rows) / prompts)))


def save(v: Any, a: TrlArgs, t: Translation) -> None:
    strategy = str(getattr(a["save_strategy"], "value", a["save_strategy"]))
    if strategy == "no":
        t.set("run.save_every", 0)
        t.notes.append("save_strategy='no': Hone still saves the final checkpoint (resume needs it)")
    elif strategy == "steps":
        steps = float(a["save_steps"])
        t.set("run.save_every", rl_steps(steps if steps >= 1 else steps * int(a["max_steps"]), a))
    else:
        t.refused.append(f"save_strategy={strategy!r} (Hone saves every run.save_every RL steps)")


def eval(v: Any, a: TrlArgs, t: Translation) -> None:
    strategy = str(getattr(a["eval_strategy"], "value", a["eval_strategy"]))
    if strategy == "no":
        t.set("run.eval_every", 0)
        return
    if strategy != "steps":
        t.refused.append(f"eval_strategy={strategy!r} (Hone evaluates every run.eval_every RL steps)")
        return
    steps = a["eval_steps"] if a["eval_steps"] is not None else a["logging_steps"]
    t.set("run.eval_every", rl_steps(float(steps), a))
    if a["num_generations_eval"] is not None:
        t.set("eval.n", int(a["num_generations_eval"]))


# --- the objective ------------------------------------------------------------------------------------

_LOSS_AGG = {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "bnpo": "token-mean", "dr_grpo": None}


def loss_type(v: Any, a: TrlArgs, t: Translation) -> None:
    if v == "cispo":
        t.set("algorithm.policy_loss", "cispo")
        high = a["epsilon_high"] if a["epsilon_high"] is not None else a["epsilon"]
        t.set(
            "algorithm.clip_high", float(high) - 1.0
        )  # TRL caps the weight at epsilon_high, Hone at 1+clip_high
        return
    if v not in _LOSS_AGG:
        t.refused.append(f"loss_type={v!r} (Hone's losses: grpo, dapo, bnpo, dr_grpo, cispo)")
        return
    if v == "dr_grpo":
        t.set("algorithm.loss_agg", "seq-mean-token-sum-norm")  # / (sequences x max_completion_length)
    else:
        t.set("algorithm.loss_agg", _LOSS_AGG[v])
    if v == "bnpo":
        t.notes.append(
            "loss_type='bnpo': token-mean over each optimizer step's tokens (TRL normalises per local batch)"
        )


def clip(v: Any, a: TrlArgs, t: Translation) -> None:
    if a["loss_type"] == "cispo":
        return  # `loss_type` set CISPO's cap
    t.set("algorithm.clip_low", float(a["epsilon"]))
    # TRL's epsilon_high defaults to epsilon; Hone's unset clip_high would be the loss's own.
    t.set("algorithm.clip_high", float(a["epsilon_high"] if a["epsilon_high"] is not None else a["epsilon"]))


def scale_rewards(v: Any, a: TrlArgs, t: Translation) -> None:
    scale = {True: "group", False: "none"}.get(v, v)
    t.set("algorithm.advantage", "grpo")
    t.set("algorithm.eps", 1e-4)  # TRL's std guard
    if scale == "group":
        t.set("algorithm.norm_by_std", True)
    elif scale == "none":
        t.set("algorithm.norm_by_std", False)
    elif scale == "batch":
        t.set("algorithm.norm_by_std", True)
        t.set("algorithm.advantage_args", {"std_over": "batch"})
    else:
        t.refused.append(f"scale_rewards={v!r} (TRL's values: group, batch, none)")


def importance_level(v: Any, a: TrlArgs, t: Translation) -> None:
    if v == "sequence":
        if a["loss_type"] == "cispo":
            t.refused.append(
                "importance_sampling_level='sequence' with loss_type='cispo' (CISPO is per token)"
            )
            return
        t.set("algorithm.policy_loss", "gspo")
    elif v != "token":
        t.refused.append(f"importance_sampling_level={v!r} (Hone: token (ppo) or sequence (gspo))")


def beta(v: Any, a: TrlArgs, t: Translation) -> None:
    t.set("algorithm.kl", {"coef": float(v), "estimator": "k3", "placement": "loss"})


def vllm(v: Any, a: TrlArgs, t: Translation) -> None:
    if not v:
        return
    t.set("rollout.engine", "vllm")
    if a["vllm_mode"] == "server":
        t.refused.append(
            "vllm_mode='server' (Hone runs its own vLLM engine process, rollout.engine=vllm, not a server)"
        )
    if a["vllm_importance_sampling_correction"]:
        mode = str(a["vllm_importance_sampling_mode"])
        level, _, kind = mode.partition("_")
        cap = float(a["vllm_importance_sampling_clip_max"] or a["vllm_importance_sampling_cap"] or 3.0)
        off: dict[str, Any] = {"name": "tis" if kind == "truncate" else "mis", "level": level}
        off["cap" if kind == "truncate" else "hi"] = cap
        if kind == "mask" and a["vllm_importance_sampling_clip_min"] is not None:
            off["lo"] = float(a["vllm_importance_sampling_clip_min"])
        t.set("algorithm.off_policy", off)
        t.set("algorithm.old_log_probs", "recompute")


def peft(v: Any, a: TrlArgs, t: Translation) -> None:
    if not v:
        return
    modules = a["lora_target_modules"]
    t.set(
        "model.lora",
        {
            "r": int(a["lora_r"]),
            "alpha": int(a["lora_alpha"]),
            "dropout": float(a["lora_dropout"]),
            "target_modules": modules if modules not in (None, ["all-linear"]) else "all-linear",
        },
    )


def dtype(v: Any, a: TrlArgs, t: Translation) -> None:
    if v in (None, "auto", "float32", "bfloat16"):
        if v is not None:
            t.set("model.dtype", v)
    else:
        t.refused.append(f"dtype={v!r} (Hone trains in float32, bfloat16 or the checkpoint's own: auto)")


def bf16(v: Any, a: TrlArgs, t: Translation) -> None:
    if a["fp16"]:
        t.refused.append("fp16=True (Hone's mixed precision is bfloat16: bf16=True)")
    elif v or (v is None and not a["fp16"]):  # TRL: bf16 defaults to `not fp16`
        t.set("trainer.autocast", "bfloat16")


def report_to(v: Any, a: TrlArgs, t: Translation) -> None:
    targets = [v] if isinstance(v, str) else list(v or [])
    if "all" in targets:
        targets = ["tensorboard", "wandb"]
    t.set("logging.tensorboard", "tensorboard" in targets)
    t.set("logging.wandb", "wandb" in targets)
    others = [x for x in targets if x not in ("tensorboard", "wandb", "none")]
    if others:
        t.refused.append(f"report_to={others} (Hone reports to tensorboard and wandb)")


def completions(v: Any, a: TrlArgs, t: Translation) -> None:
    if not a["log_completions"]:
        return
    every = a["num_completions_to_print"]
    batch = int(t.get("data.prompts_per_step", 1)) * int(a["num_generations"])
    t.set("logging.samples", int(every) if every else batch)


def output_dir(v: Any, a: TrlArgs, t: Translation) -> None:
    """`output_dir` is the run directory (transformers' default `trainer_output`)."""
    parent, _, name = str(v or "trainer_output").rstrip("/").rpartition("/")
    t.set("run.dir", parent or ".")
    t.set("run.name", name)


def schedule(v: Any, a: TrlArgs, t: Translation) -> None:
    name = str(getattr(v, "value", v))
    known = {
        "linear": "linear",
        "cosine": "cosine",
        "constant": "constant",
        "constant_with_warmup": "constant",
    }
    if name not in known:
        t.refused.append(f"lr_scheduler_type={name!r} (Hone's schedules: constant, linear, cosine)")
        return
    t.set("trainer.schedule", known[name])
    warmup = float(a["warmup_steps"] or 0) or float(a["warmup_ratio"] or 0) * max(int(a["max_steps"]), 0)
    if 0 < warmup < 1:  # transformers 5: a float below 1 is a ratio of the training steps
        warmup *= max(int(a["max_steps"]), 0)
    if warmup:
        t.set("trainer.warmup_steps", rl_steps(warmup, a))


def optim(v: Any, a: TrlArgs, t: Translation) -> None:
    name = str(getattr(v, "value", v))
    if name in ("adamw_torch_fused", "adamw_torch"):
        t.set("trainer.fused_adamw", name == "adamw_torch_fused")
    else:
        t.refused.append(
            f"optim={name!r} (Hone's optimizer is torch's AdamW: adamw_torch or adamw_torch_fused)"
        )


def tool_iterations(v: Any, a: TrlArgs, t: Translation) -> None:
    if v is not None:
        t.set("env.max_turns", int(v) + 1)  # each tool round is a turn, and the answer after the last


# --- the script's model, dataset and rewards (`trl grpo`'s ScriptArguments, or GRPOTrainer's arguments) ---

TRL_REWARDS = {  # `trl grpo --reward_funcs` names (trl/scripts/grpo.py)
    "accuracy_reward": ("trl.rewards:accuracy_reward", {}),
    "reasoning_accuracy_reward": ("trl.rewards:reasoning_accuracy_reward", {}),
    "think_format_reward": ("trl.rewards:think_format_reward", {}),
    "get_soft_overlong_punishment": (
        "trl.rewards:get_soft_overlong_punishment",
        {"max_completion_len": 1280, "soft_punish_cache": 256},
    ),
}


def model(v: Any, a: TrlArgs, t: Translation) -> None:
    if not v:
        t.refused.append("model_name_or_path: none given (the model to train: a hub name or a folder)")
    else:
        t.set("model.path", str(v))


def reward_spec(entry: str) -> tuple[str, dict[str, Any]] | None:
    """A `reward_funcs` entry as a Hone spec and factory args: a TRL name, `pkg.mod:fn` (or `script:name`,
    an object a program registered), or TRL's dotted `pkg.mod.fn`; None for anything else."""
    if entry in TRL_REWARDS:
        return TRL_REWARDS[entry]
    if ":" in entry:
        return entry, {}
    module, _, attr = entry.rpartition(".")
    return (f"{module}:{attr}", {}) if module else None


def rewards(v: Any, a: TrlArgs, t: Translation) -> None:
    """`reward_funcs`, `reward_model_name_or_path` and `reward_weights`: one Hone component each, in TRL's
    order (the reward models first, as `trl grpo` appends them), every function on TRL's contract."""
    models = a["reward_model_name_or_path"]
    models = [models] if isinstance(models, str) else list(models or [])
    entries: list[tuple[str, dict[str, Any]]] = []
    for model in models:
        name = str(model).rstrip("/").rpartition("/")[2] or "reward_model"
        entries.append((name, {"fn": "reward_model", "args": {"path": str(model)}}))
    for entry in [v] if isinstance(v, str) else list(v or []):
        spec = reward_spec(str(entry))
        if spec is None:
            t.refused.append(
                f"reward_funcs={entry!r} (expected one of {', '.join(TRL_REWARDS)} or an import path)"
            )
            continue
        fn, args = spec
        name = fn.rpartition(":")[2]
        entries.append(
            (name, {"fn": fn, "args": args, "contract": "trl"} if args else {"fn": fn, "contract": "trl"})
        )
    if not entries:
        if a.env_rewards:  # an environment's get_reward is the reward
            return
        t.refused.append("reward_funcs: none given (TRL needs at least one reward function or model)")
        return
    weights = a["reward_weights"]
    if weights is not None and len(weights) != len(entries):
        t.refused.append(
            f"reward_weights={list(weights)} ({len(weights)} weights for {len(entries)} reward functions)"
        )
        return
    components: dict[str, Any] = {}
    for k, (name, part) in enumerate(entries):
        unique, n = name, 2
        while unique in components:  # two rewards of one name: TRL logs both under it, Hone needs two keys
            unique, n = f"{name}_{n}", n + 1
        if weights is not None:
            part["weight"] = float(weights[k])
        components[unique] = part
    t.set("reward.components", components)


def dataset(v: Any, a: TrlArgs, t: Translation) -> None:
    """`dataset_name` (a hub name, a file or a `save_to_disk` folder) and `dataset_config`; the eval rows
    are its `dataset_test_split` where TRL evaluates (`eval_strategy` not 'no')."""
    if a["datasets"]:
        t.refused.append("datasets=[...] (a dataset mixture: give one dataset_name)")
        return
    if not v:
        t.refused.append("dataset_name: none given (TRL needs a dataset)")
        return
    t.set("data.task", None)
    t.set("data.source", str(v))
    if a["dataset_config"]:
        t.set("data.subset", str(a["dataset_config"]))
    if str(getattr(a["eval_strategy"], "value", a["eval_strategy"])) != "no":
        if a["dataset_test_split"] != "test":
            t.refused.append(
                f"dataset_test_split={a['dataset_test_split']!r} (Hone evaluates on a source's 'test' split)"
            )
        t.set("data.eval_source", str(v))

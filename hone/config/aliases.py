"""Peers' spellings of Hone's keys, for the unknown-key error ("did you mean ...") and the coming-from docs.

`PEER_KEYS[name] = (hone_key, note)`: `name` is the bare flag or key a TRL (GRPOConfig), verl (Hydra
config) or OpenRLHF (CLI) user types, `hone_key` the dotted Hone key that does that job (every one exists
in the schema: tests/test_presets.py walks it), `note` whose spelling it is and any trap in the mapping.
Only spellings that differ from Hone's own (or sit in another section) are listed. The tables in
docs/coming-from/ say the same; keep them in step. Leaf module: imports nothing.
"""

from __future__ import annotations

PEER_KEYS: dict[str, tuple[str, str]] = {
    # --- sampling ---
    "num_generations": ("rollout.n", "TRL: completions per prompt (the group size)"),
    "n_samples_per_prompt": ("rollout.n", "OpenRLHF: responses per prompt (the group size)"),
    "max_completion_length": (
        "rollout.max_new_tokens",
        "TRL; also Dr. GRPO's constant normaliser (loss_agg seq-mean-token-sum-norm) in both",
    ),
    "max_response_length": ("rollout.max_new_tokens", "verl data.max_response_length"),
    "generate_max_len": ("rollout.max_new_tokens", "OpenRLHF"),
    "use_vllm": ("rollout.engine", "TRL: rollout.engine: vllm (needs make setup-vllm)"),
    # --- batch shape ---
    "train_batch_size": (
        "data.prompts_per_step",
        "verl data.train_batch_size counts PROMPTS per step (= data.prompts_per_step); OpenRLHF "
        "--train_batch_size counts SAMPLES per optimizer step (trainer.mini_batches = rollout_batch_size x "
        "n_samples_per_prompt / train_batch_size)",
    ),
    "rollout_batch_size": ("data.prompts_per_step", "OpenRLHF: prompts per rollout step"),
    "ppo_mini_batch_size": (
        "trainer.mini_batches",
        "verl ppo_mini_batch_size is a SIZE in prompts; trainer.mini_batches is a COUNT: "
        "data.train_batch_size / ppo_mini_batch_size",
    ),
    "steps_per_generation": (
        "trainer.mini_batches",
        "TRL: optimizer steps per generated batch = steps_per_generation / gradient_accumulation_steps",
    ),
    "ppo_micro_batch_size_per_gpu": ("trainer.micro_batch_size", "verl: sequences per forward/backward"),
    "micro_train_batch_size": ("trainer.micro_batch_size", "OpenRLHF: sequences per forward/backward"),
    "per_device_train_batch_size": (
        "trainer.micro_batch_size",
        "TRL: sequences per forward/backward; Hone derives gradient accumulation from it and "
        "trainer.micro_batch_tokens",
    ),
    "ppo_max_token_len_per_gpu": (
        "trainer.micro_batch_tokens",
        "verl use_dynamic_bsz: tokens per micro-batch",
    ),
    "num_iterations": ("trainer.ppo_epochs", "TRL: passes over each batch (mu)"),
    "max_epochs": ("trainer.ppo_epochs", "OpenRLHF: passes over each batch"),
    "total_training_steps": ("run.steps", "verl trainer.total_training_steps"),
    "max_steps": ("run.steps", "TRL (transformers TrainingArguments)"),
    "num_episodes": (
        "run.steps",
        "OpenRLHF counts passes over the prompts; Hone counts RL steps (prompts / data.prompts_per_step "
        "per pass)",
    ),
    # --- optimizer ---
    "learning_rate": ("trainer.lr", "TRL (default 1e-6; Hone's default 1e-4 suits the tiny demo model)"),
    "actor_learning_rate": ("trainer.lr", "OpenRLHF"),
    "critic_learning_rate": ("critic.lr", "OpenRLHF; Hone's critic is a separate model with its own AdamW"),
    "max_grad_norm": ("trainer.grad_clip", "TRL (transformers TrainingArguments)"),
    "max_norm": ("trainer.grad_clip", "OpenRLHF"),
    "l2": ("trainer.weight_decay", "OpenRLHF"),
    "adam_betas": ("trainer.betas", "OpenRLHF"),
    "lr_scheduler_type": ("trainer.schedule", "TRL (default linear): constant | cosine | linear in Hone"),
    "lr_scheduler": ("trainer.schedule", "OpenRLHF (default cosine_with_min_lr): constant | cosine | linear"),
    "adam_beta1": ("trainer.betas", "TRL: trainer.betas is the pair [beta1, beta2]"),
    "adam_beta2": ("trainer.betas", "TRL: trainer.betas is the pair [beta1, beta2]"),
    "warmup_ratio": ("trainer.warmup_steps", "TRL gives a ratio of the run; Hone takes RL steps"),
    "lr_warmup_steps": ("trainer.warmup_steps", "verl: Hone's warm-up counts RL steps"),
    "lr_warmup_ratio": (
        "trainer.warmup_steps",
        "OpenRLHF gives a ratio of the run; Hone takes RL steps (ratio x run.steps)",
    ),
    # --- advantage ---
    "adv_estimator": (
        "algorithm.advantage",
        "verl: grpo, rloo, gae (needs a critic section) keep their names; reinforce_plus_plus -> "
        "reinforce_pp, reinforce_plus_plus_baseline -> reinforce_pp_baseline; remax, opo, grpo_passk, gpg "
        "are not in Hone",
    ),
    "advantage_estimator": (
        "algorithm.advantage",
        "OpenRLHF: group_norm -> grpo, reinforce -> reinforce_pp, reinforce_baseline -> "
        "reinforce_pp_baseline; rloo, dr_grpo, gae keep their names (gae needs a critic section)",
    ),
    "norm_adv_by_std_in_grpo": ("algorithm.norm_by_std", "verl: false is Dr. GRPO's advantage"),
    "no_advantage_std_norm": ("algorithm.norm_by_std", "OpenRLHF: the flag is the negation (set false)"),
    "scale_rewards": (
        "algorithm.norm_by_std",
        "TRL: group/true -> true, none/false -> false; 'batch' (group mean, batch std) has no exact "
        "equivalent: reinforce_pp_baseline (group mean, then batch whitening) is the closest",
    ),
    "lambd": ("algorithm.lam", "OpenRLHF: GAE lambda"),
    # --- policy loss ---
    "loss_type": (
        "algorithm.loss_agg",
        "TRL: grpo -> seq-mean-token-mean, dapo/bnpo -> token-mean, dr_grpo -> seq-mean-token-sum-norm "
        "(or algorithm.preset: dr_grpo, which also drops the std division), cispo -> "
        "algorithm.policy_loss: cispo; sapo and luspo are not in Hone",
    ),
    "loss_agg_mode": ("algorithm.loss_agg", "verl: same four names"),
    "epsilon": (
        "algorithm.clip_low",
        "TRL: epsilon alone clips both sides; in Hone an unset clip_high is the loss's own default, not "
        "clip_low: set both",
    ),
    "epsilon_high": ("algorithm.clip_high", "TRL (DAPO's clip-higher: 0.28)"),
    "clip_ratio": ("algorithm.clip_low", "verl: both sides; set algorithm.clip_low and algorithm.clip_high"),
    "clip_ratio_low": ("algorithm.clip_low", "verl actor.clip_ratio_low"),
    "clip_ratio_high": ("algorithm.clip_high", "verl actor.clip_ratio_high"),
    "eps_clip": (
        "algorithm.clip_low",
        "OpenRLHF: both sides; set algorithm.clip_low and algorithm.clip_high",
    ),
    "eps_clip_low_high": (
        "algorithm.clip_low",
        "OpenRLHF: two values -> algorithm.clip_low, algorithm.clip_high",
    ),
    "clip_ratio_c": (
        "algorithm.dual_clip",
        "verl: dual clip is on by default there (3.0), off in Hone (null)",
    ),
    "delta": (
        "algorithm.dual_clip",
        "TRL: INTELLECT-2's two-sided clip caps a negative-advantage token's ratio at delta, which is dual "
        "clip with c = delta",
    ),
    "importance_sampling_level": (
        "algorithm.policy_loss",
        "TRL: sequence -> policy_loss: gspo (the ratio's level is the loss's; algorithm.off_policy.level is "
        "the off-policy correction's, another thing)",
    ),
    "loss_mode": ("algorithm.policy_loss", "verl policy_loss.loss_mode: vanilla -> ppo, gspo -> gspo"),
    "policy_loss_type": ("algorithm.policy_loss", "OpenRLHF: ppo, gspo"),
    "entropy_coeff": ("algorithm.entropy_coef", "verl"),
    "entropy_loss_coef": ("algorithm.entropy_coef", "OpenRLHF"),
    "mask_truncated_completions": ("algorithm.mask_truncated", "TRL (DAPO's overlong filtering)"),
    # --- KL ---
    "beta": (
        "algorithm.kl.coef",
        "TRL: KL in the loss with the k3 estimator (Hone's defaults: kl.placement loss, kl.estimator k3)",
    ),
    "kl_loss_coef": ("algorithm.kl.coef", "verl, with use_kl_loss: true (kl.placement: loss)"),
    "kl_coef": (
        "algorithm.kl.coef",
        "verl algorithm.kl_ctrl.kl_coef, with use_kl_in_reward (kl.placement: reward)",
    ),
    "init_kl_coef": (
        "algorithm.kl.coef",
        "OpenRLHF: default 0.01 and in the reward (k1) unless --use_kl_loss; Hone's default is 0 (off)",
    ),
    "kl_loss_type": (
        "algorithm.kl.estimator",
        "verl: low_var_kl/k3 -> k3 (verl also clamps the value to [-10, 10], Hone does not), kl/k1 -> k1, "
        "mse/k2 -> k2; abs and full are not in Hone",
    ),
    "kl_penalty": (
        "algorithm.kl.estimator",
        "verl (KL in the reward): kl -> k1, mse -> k2, low_var_kl -> k3",
    ),
    "kl_estimator": ("algorithm.kl.estimator", "OpenRLHF: k1, k2, k3 (same names)"),
    "use_kl_loss": (
        "algorithm.kl.placement",
        "verl, OpenRLHF: true -> placement: loss (OpenRLHF without it: reward; verl: use_kl_in_reward)",
    ),
    "use_kl_in_reward": ("algorithm.kl.placement", "verl: true -> reward"),
    # --- filters ---
    "filter_groups": ("algorithm.dynamic_sampling.enabled", "verl algorithm.filter_groups.enable (DAPO)"),
    "max_num_gen_batches": (
        "algorithm.dynamic_sampling.max_rounds",
        "verl counts generation batches, the first included (0 = unlimited); Hone counts extra rounds",
    ),
    "dynamic_filtering": (
        "algorithm.dynamic_sampling.enabled",
        "OpenRLHF (with the default reward range 0-1)",
    ),
    "dynamic_filtering_reward_range": (
        "data.difficulty_filter",
        "OpenRLHF filters a group by its mean reward in this step; Hone skips a prompt whose tracked pass "
        "rate is outside [lo, hi] for cooldown_steps steps",
    ),
    "overlong_buffer": (
        "reward.components",
        "verl reward_model.overlong_buffer: a reward component {fn: overlong, args: {max_len, buffer}}",
    ),
    "overlong_buffer_len": (
        "reward.components",
        "OpenRLHF: a reward component {fn: overlong, args: {max_len, buffer}}",
    ),
    "rollout_is": (
        "algorithm.off_policy.name",
        "verl rollout correction: token|sequence -> name: tis, level",
    ),
    "rollout_rs": (
        "algorithm.off_policy.name",
        "verl rejection sampling -> name: mis (Hone's kept tokens carry the ratio; verl's alone keep 1)",
    ),
    "rollout_is_threshold": ("algorithm.off_policy.cap", "verl rollout correction: off_policy.name: tis"),
    "vllm_importance_sampling_mode": (
        "algorithm.off_policy.name",
        "TRL: token_/sequence_truncate -> tis, token_/sequence_mask -> mis, with off_policy.level",
    ),
    "vllm_importance_sampling_cap": (
        "algorithm.off_policy.cap",
        "TRL: *_truncate -> off_policy.name: tis (cap); *_mask -> mis (hi); needs old_log_probs: recompute",
    ),
    # --- critic ---
    "critic_warmup": ("critic.warmup_steps", "verl trainer.critic_warmup"),
    "freezing_actor_steps": ("critic.warmup_steps", "OpenRLHF"),
    "cliprange_value": ("critic.value_clip", "verl critic.cliprange_value"),
    "value_clip": ("critic.value_clip", "OpenRLHF"),
    "critic_pretrain": ("critic.path", "OpenRLHF"),
    # --- model, data, reward ---
    "model_name_or_path": ("model.path", "TRL scripts"),
    "pretrain": ("model.path", "OpenRLHF"),
    "lora_rank": ("model.lora.r", "verl, OpenRLHF"),
    "lora_alpha": ("model.lora.alpha", "verl, OpenRLHF"),
    "peft_config": (
        "model.lora",
        "TRL: a peft LoraConfig -> model.lora: {r, alpha, dropout, target_modules}",
    ),
    "bf16": (
        "trainer.autocast",
        "TRL: trainer.autocast: bfloat16 (fp32 weights); model.dtype: bfloat16 keeps no fp32 master copy",
    ),
    "enable_gradient_checkpointing": ("model.gradient_checkpointing", "verl"),
    "gradient_checkpointing": ("model.gradient_checkpointing", "TRL (on by default there, off in Hone)"),
    "prompt_data": ("data.source", "OpenRLHF"),
    "train_files": ("data.source", "verl data.train_files"),
    "val_files": ("data.eval_source", "verl data.val_files"),
    "prompt_key": ("data.prompt_field", "verl"),
    "input_key": ("data.prompt_field", "OpenRLHF"),
    "label_key": ("data.answer_field", "OpenRLHF"),
    "apply_chat_template": ("data.chat_template", "OpenRLHF"),
    "reward_funcs": ("reward.components", "TRL: one component per function ({fn: pkg.mod:fn, weight})"),
    "reward_weights": ("reward.components", "TRL: each component's weight"),
    "remote_rm_url": (
        "reward.fn",
        "OpenRLHF: Hone has no HTTP reward built in; a pkg.mod:fn that calls the server (or reward.fn: "
        "judge for an OpenAI-compatible endpoint)",
    ),
    "reward_pretrain": ("reward.args", "OpenRLHF: reward.fn: reward_model with reward.args.path"),
    "eval_n_samples_per_prompt": ("eval.n", "OpenRLHF"),
    "eval_temperature": ("eval.temperature", "OpenRLHF"),
    # --- run, logging ---
    "output_dir": ("run.dir", "TRL: Hone writes runs/<run.name> under run.dir"),
    "save_path": ("run.dir", "OpenRLHF"),
    "save_steps": ("run.save_every", "TRL"),
    "save_freq": ("run.save_every", "verl"),
    "eval_steps": ("run.eval_every", "TRL"),
    "test_freq": ("run.eval_every", "verl"),
    "use_wandb": ("logging.wandb", "OpenRLHF"),
    "use_tensorboard": ("logging.tensorboard", "OpenRLHF"),
    "project_name": ("logging.wandb_project", "verl trainer.project_name"),
    "experiment_name": ("run.name", "verl trainer.experiment_name"),
    "logger": (
        "logging.wandb",
        "verl trainer.logger: wandb -> logging.wandb, tensorboard -> logging.tensorboard",
    ),
    "n_gpus_per_node": (
        "trainer.world_size",
        "verl: Hone's learner ranks (one GPU each); samplers are placed by cluster.* on Ray",
    ),
    "report_to": ("logging.wandb", "TRL: wandb -> logging.wandb, tensorboard -> logging.tensorboard"),
    "log_completions": (
        "logging.samples",
        "TRL: a bool there; logging.samples is how many samples per step go to runs/<name>/samples.jsonl",
    ),
}

"""The RL update: `RLTrainer.update(batch) -> metrics`.

One call = `ppo_epochs` passes over the batch, each split into `mini_batches` optimizer steps, each
accumulated over micro-batches. Every micro-batch loss is normalised by the token/sequence counts of
its whole *mini-batch* (`num_tokens`, `num_seqs`), so accumulation gives exactly the full-batch
gradient whatever the micro-batch size. The algorithm comes in by registry name.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from hone.algorithms import KL_ESTIMATORS, POLICY_LOSSES, aggregate_loss
from hone.config import AlgorithmConfig, TrainerConfig
from hone.seeding import derive_seed
from hone.training.policy import Policy, first_response_column
from hone.types import Batch


def build_optimizer(policy: Policy, cfg: TrainerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        policy.trainable_parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then constant, cosine or linear decay to 0 over `total_steps` optimizer steps."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule == "linear":
            return 1.0 - progress
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class RLTrainer:
    def __init__(
        self,
        policy: Policy,
        algorithm: AlgorithmConfig,
        trainer: TrainerConfig,
        *,
        total_rl_steps: int,
        temperature: float,
        norm_len: int,
        seed: int = 0,
    ) -> None:
        self.policy = policy
        self.algo = algorithm
        self.cfg = trainer
        self.temperature = temperature
        self.norm_len = norm_len
        self.seed = seed
        self.updates = 0
        self.optimizer = build_optimizer(policy, trainer)
        optimizer_steps = total_rl_steps * trainer.ppo_epochs * trainer.mini_batches
        self.scheduler = build_scheduler(
            self.optimizer, trainer.schedule, trainer.warmup_steps, optimizer_steps
        )

    @property
    def _agg_mode(self) -> str:
        """How KL and entropy terms aggregate: as the loss does when set, else per token."""
        return self.algo.loss_agg or "token-mean"

    def _loss_kwargs(self) -> dict[str, object]:
        kwargs: dict[str, object] = {"norm_len": self.norm_len}
        for key in ("clip_low", "clip_high", "dual_clip", "loss_agg"):
            value = getattr(self.algo, key)
            if value is not None:  # None: the loss's own default (range, aggregation)
                kwargs["agg" if key == "loss_agg" else key] = value
        return kwargs

    def update(self, batch: Batch) -> dict[str, float]:
        if batch.advantages is None or batch.old_log_probs is None:
            raise ValueError("RLTrainer.update needs a batch with advantages and old_log_probs")
        kl_in_loss = self.algo.kl.coef > 0 and self.algo.kl.placement == "loss"
        if kl_in_loss and batch.ref_log_probs is None:
            raise ValueError("KL in the loss is on but the batch has no ref_log_probs")
        self.policy.model.train()
        params = self.policy.trainable_parameters()
        loss_fn = POLICY_LOSSES[self.algo.policy_loss]
        loss_kwargs = self._loss_kwargs()
        rows_total = batch.input_ids.shape[0]
        # Seeded per update so a resumed run shuffles exactly like an uninterrupted one.
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "minibatch-shuffle", self.updates))
        sums: dict[str, float] = defaultdict(float)
        tokens_seen = 0.0
        grad_norms: list[float] = []
        for _ in range(self.cfg.ppo_epochs):
            shuffle = self.cfg.ppo_epochs > 1 or self.cfg.mini_batches > 1
            order = torch.randperm(rows_total, generator=generator) if shuffle else torch.arange(rows_total)
            for mini in order.tensor_split(min(self.cfg.mini_batches, rows_total)):
                num_tokens = batch.response_mask[mini].sum()
                self.optimizer.zero_grad(set_to_none=True)
                for micro in mini.split(self.cfg.micro_batch_size):
                    mask = batch.response_mask[micro]
                    log_probs, entropy = self.policy.token_log_probs(
                        batch.input_ids[micro],
                        batch.attention_mask[micro],
                        temperature=self.temperature,
                        with_entropy=True,
                        entropy_grad=bool(self.algo.entropy_coef),
                        from_column=first_response_column(mask),
                    )
                    agg = {**loss_kwargs, "num_tokens": num_tokens, "num_seqs": len(mini)}
                    loss, metrics = loss_fn(
                        log_probs=log_probs,
                        old_log_probs=batch.old_log_probs[micro],
                        advantages=batch.advantages[micro],
                        response_mask=mask,
                        **agg,
                    )
                    sums["loss/policy"] += float(loss.detach())
                    agg_mode = {k: agg[k] for k in ("num_tokens", "num_seqs", "norm_len")}
                    if kl_in_loss:
                        kl = KL_ESTIMATORS[self.algo.kl.estimator](log_probs, batch.ref_log_probs[micro])
                        kl_loss = aggregate_loss(kl, mask, self._agg_mode, **agg_mode)
                        loss = loss + self.algo.kl.coef * kl_loss
                        sums["kl"] += float((kl.detach() * mask).sum())
                    if self.algo.entropy_coef:
                        loss = loss - self.algo.entropy_coef * aggregate_loss(
                            entropy, mask, self._agg_mode, **agg_mode
                        )
                    loss.backward()
                    n = float(mask.sum())
                    tokens_seen += n
                    sums["loss/total"] += float(loss.detach())
                    sums["entropy"] += float((entropy.detach() * mask).sum())
                    for key, value in metrics.items():
                        sums[key] += float(value) * n
                clip = self.cfg.grad_clip if self.cfg.grad_clip is not None else float("inf")
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
                self.optimizer.step()
                self.scheduler.step()
        self.updates += 1
        optimizer_steps = len(grad_norms)
        out = {key: sums.pop(key) / optimizer_steps for key in ("loss/policy", "loss/total")}
        out.update({key: value / max(tokens_seen, 1.0) for key, value in sums.items()})
        out["grad_norm"] = sum(grad_norms) / len(grad_norms)
        out["lr"] = self.scheduler.get_last_lr()[0]
        return out

    def state_dict(self) -> dict[str, object]:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.updates = int(state["updates"])  # type: ignore[arg-type]

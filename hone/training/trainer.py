"""The policy's side of the RL update: `RLTrainer.update(batch, step) -> metrics`.

The loop (epochs x mini-batches x micro-batches, skipped non-finite steps, metric means) is
`hone.training.ppo.optimize`, shared with PPO's critic; this module supplies the policy's micro-batch
losses. The loss is a sum of named terms — the policy loss (the algorithm, by registry name; its
per-token terms weighted by the off-policy correction `algorithm.off_policy` when one applies, see
`_off_policy`), the KL penalty, the entropy bonus — each a small function of one micro-batch returning
its loss and metrics (`LossTerm`).

The learning rate is a function of the RL step (and, under a time limit, of the time spent), not of
the optimizer steps taken, so filtered-out steps and short batches cannot leave the schedule short
of its end. Dropout is off for RL (`trainer.disable_dropout`); a step with a non-finite gradient
norm is skipped, and `trainer.max_nonfinite_steps` of them in a row stop the run.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch

from hone.algorithms import KL_ESTIMATORS, OFF_POLICY_CORRECTIONS, POLICY_LOSSES, aggregate_loss
from hone.algorithms.metrics import canary_metrics, importance_ess
from hone.config import AlgorithmConfig, TrainerConfig
from hone.training.distributed import Ranks
from hone.training.optim import NonFiniteGradientError as NonFiniteGradientError  # the CLI catches it here
from hone.training.optim import OptimizerStepper, RLSchedule, adamw
from hone.training.policy import Policy, disable_dropout, first_response_column
from hone.training.ppo import LossTerm, MicroBatch, Optimizee, micro_batch_rows
from hone.types import TrainBatch


def build_optimizer(policy: Policy, cfg: TrainerConfig) -> torch.optim.Optimizer:
    return adamw(
        policy.trainable_parameters(),
        lr=cfg.lr,
        betas=cfg.betas,
        weight_decay=cfg.weight_decay,
        fused=cfg.fused_adamw,
    )


class RLTrainer(Optimizee):
    """The policy as an optimizee of the RL update: its loss terms over the update's micro-batches."""

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
        ranks: Ranks | None = None,
    ) -> None:
        self.policy = policy
        self.algo = algorithm
        self.cfg = trainer
        self.temperature = temperature
        self.norm_len = norm_len
        self._entropy_coef = algorithm.entropy_coef  # this update's (`update`'s entropy_coef)
        loss_params = inspect.signature(POLICY_LOSSES[algorithm.policy_loss]).parameters
        if algorithm.off_policy.name != "none" and "token_weights" not in loss_params:
            raise ValueError(
                f"policy loss {algorithm.policy_loss!r} takes no token_weights, so algorithm.off_policy.name "
                f"{algorithm.off_policy.name!r} could not weight its tokens"
            )
        if trainer.disable_dropout:
            disable_dropout(policy.model)
        stepper = OptimizerStepper(
            build_optimizer(policy, trainer),
            policy.trainable_parameters(),
            grad_clip=trainer.grad_clip,
            max_nonfinite_steps=trainer.max_nonfinite_steps,
            limit_key="trainer.max_nonfinite_steps",
            advice="the last checkpoint is intact. Look for NaN/inf in rewards or advantages, or lower "
            "trainer.lr",
        )
        schedule = RLSchedule(trainer.schedule, trainer.warmup_steps, total_rl_steps)
        super().__init__(stepper, schedule, seed, ranks=ranks)

    @property
    def _agg_mode(self) -> str:
        """How KL and entropy terms aggregate: as the loss does when set, else per token."""
        return self.algo.loss_agg or "token-mean"

    def _loss_kwargs(self) -> dict[str, object]:
        kwargs: dict[str, object] = {}
        for key in ("clip_low", "clip_high", "dual_clip", "loss_agg"):
            value = getattr(self.algo, key)
            if value is not None:  # None: the loss's own default (range, aggregation)
                kwargs["agg" if key == "loss_agg" else key] = value
        return kwargs

    # Loss terms: each returns its contribution to the loss and its metrics (see `LossTerm`).

    def _policy_term(self, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The registered policy-gradient loss (its metrics are means over the micro-batch's tokens), each
        token's term weighted by the off-policy correction when one applies."""
        batch, rows = micro.batch, micro.rows
        weighting = {} if micro.token_weights is None else {"token_weights": micro.token_weights}
        loss, metrics = POLICY_LOSSES[self.algo.policy_loss](
            log_probs=micro.log_probs,
            old_log_probs=batch.old_logp[rows],
            advantages=batch.advantages[rows],
            response_mask=micro.mask,
            **self._loss_kwargs(),
            **micro.counts,
            **weighting,
        )
        n = float(micro.mask.sum())
        return loss, {"loss/policy": float(loss.detach()), **{k: float(v) * n for k, v in metrics.items()}}

    def _kl_term(self, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """kl.coef x the KL estimate to the reference, aggregated as the policy loss is."""
        assert micro.batch.ref_logp is not None  # checked by update
        kl = KL_ESTIMATORS[self.algo.kl.estimator](micro.log_probs, micro.batch.ref_logp[micro.rows])
        loss = self.algo.kl.coef * aggregate_loss(kl, micro.mask, self._agg_mode, **micro.counts)
        return loss, {"kl": float((kl.detach() * micro.mask).sum())}

    def _entropy_term(self, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The entropy bonus, -entropy_coef x entropy (logged as "entropy" whether or not it is a term)."""
        assert micro.entropy is not None  # computed with grad whenever this term is on
        entropy = aggregate_loss(micro.entropy, micro.mask, self._agg_mode, **micro.counts)
        return -(self._entropy_coef * entropy), {}

    def _loss_terms(self) -> list[LossTerm]:
        """The terms of this configuration's loss, summed in this order."""
        terms: list[LossTerm] = [self._policy_term]
        if self._kl_in_loss:
            terms.append(self._kl_term)
        if self._entropy_coef:
            terms.append(self._entropy_term)
        return terms

    @property
    def _kl_in_loss(self) -> bool:
        return self.algo.kl.coef > 0 and self.algo.kl.placement == "loss"

    def _off_policy(self, batch: TrainBatch) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The off-policy correction (`algorithm.off_policy`) of the whole batch, once per update: the
        per-token weights of the policy loss (weight x keep: a dropped token's term is 0 and the loss's
        token/sequence counts are unchanged, the estimator rho * 1[kept] of hone/algorithms/offpolicy.py),
        or None for `none`, and its metrics. Anchor: `old_logp` (the trainer's recomputation); behaviour:
        `behaviour_logp`. With `algorithm.old_log_probs: sampler` the anchor is the behaviour: there is
        nothing to correct or measure (the config allows no correction then)."""
        cfg = self.algo.off_policy
        if self.algo.old_log_probs == "sampler":
            return None, {}
        correction = OFF_POLICY_CORRECTIONS[cfg.name](
            anchor_log_probs=batch.old_logp,
            behaviour_log_probs=batch.behaviour_logp,
            response_mask=batch.loss_mask,
            level=cfg.level,
            cap=cfg.cap,
            lo=cfg.lo,
            hi=cfg.hi,
            bound=cfg.bound,
        )
        # `none` only measures: its weights are all 1, and leaving them out keeps today's update exact.
        weights = None if cfg.name == "none" else correction.weights * correction.keep
        return weights, correction.metrics

    def _micro_losses(
        self,
        batch: TrainBatch,
        mini: torch.Tensor,
        terms: list[LossTerm],
        sums: dict[str, float],
        mismatch: list[float] | None,
        token_weights: torch.Tensor | None,
    ) -> Iterator[torch.Tensor]:
        """The loss of each micro-batch of mini-batch `mini` (one forward each, lazily: the optimizer step
        backwards one before the next is built); adds their metrics to `sums` and, when given, the
        sampler/trainer log-prob gap to `mismatch` ([sum of |gap|, tokens]). `token_weights` [B, T]: the
        off-policy correction's, or None."""
        counts = {
            "num_tokens": batch.loss_mask[mini].sum(),
            "num_seqs": len(mini),
            "norm_len": self.norm_len,
        }
        with_entropy = self.cfg.log_entropy or bool(self._entropy_coef)
        # A shared-prompt forward is one or two model calls by the micro-batch's rows; N ranks must make the
        # same calls (FSDP2 gathers in each), so there every micro-batch forwards its rows whole.
        shared = self.cfg.shared_prompts and self.ranks.world == 1
        prompt_lens = batch.prompt_lens if shared else None
        # On N ranks this rank's share of the mini-batch, padded to as many micro-batches as any rank runs.
        for rows, padding in self.ranks.micro_batches(
            mini, micro_batch_rows(self.cfg, batch.input_ids.shape[1])
        ):
            mask = batch.loss_mask[rows]
            with self.autocast():
                log_probs, entropy = self.policy.token_log_probs(
                    batch.input_ids[rows],
                    batch.attention_mask[rows],
                    temperature=self.temperature,
                    with_entropy=with_entropy,
                    entropy_grad=bool(self._entropy_coef),
                    from_column=first_response_column(mask),
                    prompt_lens=None if prompt_lens is None else prompt_lens[rows],
                    vision=None if batch.vision is None else batch.vision.select(rows),
                )
            weights = None if token_weights is None else token_weights[rows]
            micro = MicroBatch(batch, rows, mask, log_probs, entropy, counts, weights)
            loss: torch.Tensor | None = None
            metrics: dict[str, float] = {}
            for term in terms:
                term_loss, term_metrics = term(micro)
                loss = term_loss if loss is None else loss + term_loss
                metrics |= term_metrics
            assert loss is not None  # the policy term is always on
            if padding:  # the collectives of a forward and backward, nothing learnt or counted
                yield self.ranks.weigh(loss, padding)
                continue
            for key, value in metrics.items():
                sums[key] += value
            n = float(mask.sum())
            sums["tokens"] += n
            sums["loss/total"] += float(loss.detach())
            if entropy is not None:
                sums["entropy"] += float((entropy.detach() * mask).sum())
            if mismatch is not None:
                gap = torch.where(mask.bool(), log_probs.detach() - batch.old_logp[rows], 0.0)
                mismatch[0] += float(gap.abs().sum())
                mismatch[1] += n
                # Importance weights π_θ/π_behav of the update's first forward: the off-policyness.
                weights = torch.exp(log_probs.detach() - batch.behaviour_logp[rows]) * mask
                mismatch[5] += float(weights.sum())
                mismatch[6] += float((weights * weights).sum())
                # ... and of whole sequences, exp(Σ_t log ratio): what sequence-level credit depends on.
                sequences = torch.exp(((log_probs.detach() - batch.behaviour_logp[rows]) * mask).sum(-1))
                mismatch[7] += float(sequences.sum())
                mismatch[8] += float((sequences * sequences).sum())
                mismatch[9] += float(len(sequences))
                if batch.fresh is not None:  # the canary: rows the sampler drew with these very weights
                    fresh = gap.abs() * batch.fresh[rows, None]
                    mismatch[2] += float(fresh.sum())
                    mismatch[3] += float((mask * batch.fresh[rows, None]).sum())
                    mismatch[4] = max(mismatch[4], float(fresh.max()) if fresh.numel() else 0.0)
            yield self.ranks.weigh(loss, padding)

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """`trainer.autocast: bfloat16`: the forward's matmuls in bf16 (on CPUs with AMX/AVX-512 BF16 and on
        GPUs several times faster than fp32); `token_log_probs` takes the logits back to fp32 before the
        log-softmax, and the backward (run outside, as torch recommends) follows the recorded casts."""
        if self.cfg.autocast == "none":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.policy.device.type, dtype=torch.bfloat16)

    def update(self, batch: TrainBatch, step: int, *, entropy_coef: float | None = None) -> dict[str, float]:
        """One RL update of the batch of RL step `step` (0-based), which sets the learning rate;
        `entropy_coef` replaces `algorithm.entropy_coef` for this update (the entropy guard's)."""
        self._entropy_coef = self.algo.entropy_coef if entropy_coef is None else entropy_coef
        if self._kl_in_loss and batch.ref_logp is None:
            raise ValueError("KL in the loss is on but the batch has no ref_logp")
        self.policy.model.train()
        lr = self.cfg.lr * self.schedule.factor(step)
        terms = self._loss_terms()
        token_weights, correction_metrics = self._off_policy(batch)
        # Until the first optimizer step the policy is the one that sampled, so in sampler mode the
        # first mini-batch's forward gives the sampler/trainer log-prob mismatch without an extra pass.
        # [sum |gap|, tokens] over the mini-batch; then the same over its fresh rows, and their largest gap.
        mismatch = [0.0] * 10  # ... and the importance weights' sums and sums of squares
        watch_mismatch = self.algo.old_log_probs == "sampler"

        def micro_losses(mini: torch.Tensor, k: int, sums: dict[str, float]) -> Iterator[torch.Tensor]:
            watched = mismatch if watch_mismatch and k == 0 else None
            return self._micro_losses(batch, mini, terms, sums, watched, token_weights)

        steps = self.optimize(micro_losses, batch, cfg=self.cfg, lr=lr, where=f"RL step {step + 1}")
        out: dict[str, float] = {"train/nonfinite_steps": float(steps.skipped), **correction_metrics}
        gap = self.ranks.sum_metrics({"sum": mismatch[0], "tokens": mismatch[1]})
        if gap["tokens"]:
            out["mismatch/logprob_abs"] = gap["sum"] / gap["tokens"]
            weights = self.ranks.sum_metrics(
                {
                    "sum": mismatch[5],
                    "squares": mismatch[6],
                    "seq": mismatch[7],
                    "seq2": mismatch[8],
                    "n": mismatch[9],
                }
            )
            out["offpolicy/ess"] = importance_ess(weights["sum"], weights["squares"], gap["tokens"])
            out["offpolicy/ess_seq"] = importance_ess(weights["seq"], weights["seq2"], weights["n"])
        if watch_mismatch and batch.fresh is not None:
            fresh = self.ranks.sum_metrics({"sum": mismatch[2], "tokens": mismatch[3]})
            out |= canary_metrics(fresh["sum"], fresh["tokens"], self.ranks.max_metric(mismatch[4]))
        if not steps.grad_norms:  # every step skipped: no loss was applied, and no LR
            return out
        out.update(steps.means())
        out["lr"] = lr  # the LR every applied optimizer step of this RL step used
        return out

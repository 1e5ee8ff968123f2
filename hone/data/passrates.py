"""Per-prompt pass-rate estimates and the online difficulty filter built on them.

Difficulty-targeted curricula (PCL, Gao et al. 2025; PACED-RL) and online filters (ROLL's difficulty mask,
OpenRLHF's dynamic filtering) all need, per prompt, how often the current policy solves it. Hone keeps an
exponential moving average of each prompt's group pass rate, updated from every group it gets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from hone.types import Sample

Outcome = tuple[int, int]  # one prompt's rollouts in one step: (correct, scored)


def meta_prior(sample: Sample, default: float = 0.5) -> float:
    """The pass rate assumed for a prompt never seen: `meta["pass_rate_prior"]` when a data source sets
    one (the hook for graded tasks, e.g. a reasoning-gym difficulty level mapped to an expected pass
    rate), else `default`."""
    prior = sample.meta.get("pass_rate_prior")
    return float(prior) if isinstance(prior, int | float) and 0.0 <= prior <= 1.0 else default


class PassRates:
    """`rates[id]`: the EMA of a prompt's group pass rate k/n. The first group sets it outright (no prior
    mixed in), so one group of all-correct answers reads 1.0 and the filter can act on it, as ROLL's
    per-group mask does; later groups move it by `ema` of the way: p ← (1 − ema)·p + ema·k/n, so an
    estimate follows the policy as it improves instead of averaging over its whole history."""

    def __init__(self, ema: float, prior: Callable[[Sample], float] = meta_prior) -> None:
        if not 0.0 < ema <= 1.0:
            raise ValueError(f"pass-rate ema must be in (0, 1], got {ema}")
        self.ema = ema
        self.prior = prior
        self.rates: dict[str, float] = {}

    def update(self, outcomes: Mapping[str, Outcome]) -> None:
        for sample_id, (correct, scored) in outcomes.items():
            if scored == 0:  # every reward failed: nothing was learnt about the prompt
                continue
            x = correct / scored
            p = self.rates.get(sample_id)
            self.rates[sample_id] = x if p is None else (1.0 - self.ema) * p + self.ema * x

    def get(self, sample: Sample) -> float:
        return self.rates.get(sample.id, self.prior(sample))

    def seen(self, sample: Sample) -> bool:
        return sample.id in self.rates


class CoolDown:
    """The online difficulty filter: a prompt whose tracked pass rate leaves `[lo, hi]` when a step's
    results come in is skipped for the next `cooldown_steps` steps, then drawn again, so that a prompt
    the policy has since learnt (or forgotten) gets re-measured. Skipping rather than down-weighting:
    a group that is all right or all wrong has zero GRPO advantage, so its rollouts cost samples and
    teach nothing; there is no weight at which they help."""

    def __init__(self, lo: float, hi: float, cooldown_steps: int) -> None:
        self.lo, self.hi, self.cooldown_steps = lo, hi, cooldown_steps
        self.until: dict[str, int] = {}  # sample id -> the last step it is skipped at

    def update(self, step: int, rates: PassRates, sample_ids: Iterable[str]) -> None:
        """After step `step`'s results: cool down the prompts out of range, re-admit those back in it."""
        self.until = {i: last for i, last in self.until.items() if last > step}  # expired entries go
        for sample_id in sample_ids:
            p = rates.rates.get(sample_id)
            if p is not None and not self.lo <= p <= self.hi:
                self.until[sample_id] = step + self.cooldown_steps
            else:
                self.until.pop(sample_id, None)

    def skipped(self, sample_id: str, step: int) -> bool:
        return self.until.get(sample_id, -1) >= step

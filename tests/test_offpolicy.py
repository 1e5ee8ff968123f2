"""Off-policy corrections (`algorithm.off_policy`) against hand-computed values, in float64.

The fixture's ratios ρ = π_anchor/π_behav are row 0: [3, 0.6, 1], row 1: [1.5, 0.25, padding], so
every expected weight below is written out from these five numbers; no value sits on a bound.
"""

from __future__ import annotations

import math

import pytest
import torch

from hone.algorithms import OFF_POLICY_CORRECTIONS
from hone.config import ConfigError, load_config
from hone.types import Batch

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
BEHAVIOUR = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -3.0, 0.0]], dtype=torch.float64)
RATIOS = [[3.0, 0.6, 1.0], [1.5, 0.25, 1.0]]
ANCHOR = BEHAVIOUR + torch.tensor(RATIOS, dtype=torch.float64).log()
# |log ρ| over the five response tokens: ln 3 + ln(1/0.6) + 0 + ln 1.5 + ln 4 = ln 30
LOGPROB_ABS = math.log(30) / 5
NAMES = ("none", "tis", "mis", "decoupled")


def correct(name: str, **kwargs: object):
    return OFF_POLICY_CORRECTIONS[name](
        anchor_log_probs=ANCHOR, behaviour_log_probs=BEHAVIOUR, response_mask=MASK, **kwargs
    )


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def check(result, weights: list[list[float]], keep: list[list[float]], **metrics: float) -> None:
    torch.testing.assert_close(result.weights, t(weights), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result.keep, t(keep), rtol=0, atol=0)
    names = {"is_ratio_mean", "weight_mean", "masked_frac", "truncated_frac"}
    assert set(metrics) == names
    for name, value in metrics.items():
        assert result.metrics[f"off_policy/{name}"] == pytest.approx(value, rel=1e-12, abs=1e-12), name
    assert result.metrics["mismatch/logprob_abs"] == pytest.approx(LOGPROB_ABS, rel=1e-12)


def test_the_four_corrections_are_registered() -> None:
    assert set(OFF_POLICY_CORRECTIONS) >= set(NAMES)


def test_none_weighs_nothing_and_still_measures_the_ratio() -> None:
    # ρ mean = (3 + 0.6 + 1 + 1.5 + 0.25) / 5 = 1.27
    check(
        correct("none"),
        [[1, 1, 1], [1, 1, 1]],
        [[1, 1, 1], [1, 1, 0]],
        is_ratio_mean=1.27,
        weight_mean=1.0,
        masked_frac=0.0,
        truncated_frac=0.0,
    )


def test_tis_token_truncates_at_the_default_cap_of_2() -> None:
    # min(ρ, 2): [2, 0.6, 1], [1.5, 0.25]; weight mean 5.35 / 5; one of five truncated
    check(
        correct("tis"),
        [[2, 0.6, 1], [1.5, 0.25, 1]],
        [[1, 1, 1], [1, 1, 0]],
        is_ratio_mean=1.27,
        weight_mean=1.07,
        masked_frac=0.0,
        truncated_frac=0.2,
    )


def test_tis_sequence_uses_the_product_of_the_ratios() -> None:
    # row 0: 3 · 0.6 · 1 = 1.8 → min(1.8, 1.5) = 1.5 on 3 tokens; row 1: 1.5 · 0.25 = 0.375 on 2 tokens
    # ρ mean over tokens (3 · 1.8 + 2 · 0.375) / 5 = 1.23; weight mean (4.5 + 0.75) / 5 = 1.05
    check(
        correct("tis", level="sequence", cap=1.5),
        [[1.5, 1.5, 1.5], [0.375, 0.375, 1]],
        [[1, 1, 1], [1, 1, 0]],
        is_ratio_mean=1.23,
        weight_mean=1.05,
        masked_frac=0.0,
        truncated_frac=0.6,
    )


def test_tis_geometric_uses_the_per_token_geometric_mean() -> None:
    g0, g1 = 1.8 ** (1 / 3), 0.375**0.5  # 1.2164, 0.6124: under the cap
    mean = (3 * g0 + 2 * g1) / 5
    check(
        correct("tis", level="geometric"),
        [[g0, g0, g0], [g1, g1, 1]],
        [[1, 1, 1], [1, 1, 0]],
        is_ratio_mean=mean,
        weight_mean=mean,
        masked_frac=0.0,
        truncated_frac=0.0,
    )


def test_mis_token_drops_ratios_outside_the_bounds_and_weighs_the_rest() -> None:
    # [0.5, 2] keeps 0.6, 1 and 1.5 (weighted by ρ), drops 3 and 0.25 (weight 1, keep 0)
    # weight mean (0 + 0.6 + 1 + 1.5 + 0) / 5 = 0.62; two of five dropped
    check(
        correct("mis"),
        [[1, 0.6, 1], [1.5, 1, 1]],
        [[0, 1, 1], [1, 0, 0]],
        is_ratio_mean=1.27,
        weight_mean=0.62,
        masked_frac=0.4,
        truncated_frac=0.0,
    )


def test_mis_sequence_drops_whole_sequences() -> None:
    # row 0: 1.8 in [0.5, 2] → kept, weight 1.8; row 1: 0.375 < 0.5 → both tokens dropped
    check(
        correct("mis", level="sequence"),
        [[1.8, 1.8, 1.8], [1, 1, 1]],
        [[1, 1, 1], [0, 0, 0]],
        is_ratio_mean=1.23,
        weight_mean=5.4 / 5,
        masked_frac=0.4,
        truncated_frac=0.0,
    )


def test_mis_bounds_are_inclusive_and_configurable() -> None:
    # behaviour 0 makes log ρ exactly log(bound): both ends of [0.25, 3] are kept
    anchor = torch.tensor([[math.log(0.25), math.log(3.0), math.log(3.5)]], dtype=torch.float64)
    result = OFF_POLICY_CORRECTIONS["mis"](
        anchor_log_probs=anchor,
        behaviour_log_probs=torch.zeros_like(anchor),
        response_mask=torch.ones_like(anchor),
        lo=0.25,
        hi=3.0,
    )
    torch.testing.assert_close(result.keep, t([[1, 1, 0]]), rtol=0, atol=0)
    torch.testing.assert_close(result.weights, t([[0.25, 3.0, 1.0]]), rtol=1e-12, atol=0)


def test_decoupled_applies_the_weight_without_any_bound() -> None:
    # AReaL's trap: with no cap set, w = π_prox/π_behav was not applied. Here it is, unbounded.
    check(
        correct("decoupled"),
        [[3, 0.6, 1], [1.5, 0.25, 1]],
        [[1, 1, 1], [1, 1, 0]],
        is_ratio_mean=1.27,
        weight_mean=1.27,
        masked_frac=0.0,
        truncated_frac=0.0,
    )


def test_decoupled_clamp_bound() -> None:
    # clamp into [0.5, 2]: [2, 0.6, 1], [1.5, 0.5]; weight mean 5.6 / 5; 3 and 0.25 clamped
    check(
        correct("decoupled", bound="clamp"),
        [[2, 0.6, 1], [1.5, 0.5, 1]],
        [[1, 1, 1], [1, 1, 0]],
        is_ratio_mean=1.27,
        weight_mean=1.12,
        masked_frac=0.0,
        truncated_frac=0.4,
    )


def test_decoupled_mask_bound_is_masked_is() -> None:
    for level in ("token", "sequence"):
        masked, mis = correct("decoupled", bound="mask", level=level), correct("mis", level=level)
        assert torch.equal(masked.weights, mis.weights) and torch.equal(masked.keep, mis.keep)
        assert masked.metrics == mis.metrics


def test_decoupled_sequence_level_weight_and_lower_bound_zero() -> None:
    # lo = 0 is "no lower bound": clamp into [0, 1.6] caps row 0's 1.8 and leaves row 1's 0.375
    check(
        correct("decoupled", level="sequence", bound="clamp", lo=0.0, hi=1.6),
        [[1.6, 1.6, 1.6], [0.375, 0.375, 1]],
        [[1, 1, 1], [1, 1, 0]],
        is_ratio_mean=1.23,
        weight_mean=(3 * 1.6 + 0.75) / 5,
        masked_frac=0.0,
        truncated_frac=0.6,
    )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_padding_garbage_changes_nothing(name: str, level: str) -> None:
    # nan / ±inf / huge values on padding positions must not reach weights, keep or metrics
    anchor, behaviour = ANCHOR.clone(), BEHAVIOUR.clone()
    anchor[1, 2], behaviour[1, 2] = float("nan"), float("-inf")
    clean = correct(name, level=level)
    dirty = OFF_POLICY_CORRECTIONS[name](
        anchor_log_probs=anchor, behaviour_log_probs=behaviour, response_mask=MASK, level=level
    )
    assert dirty.weights[1, 2] == 1 and dirty.keep[1, 2] == 0
    assert torch.equal(dirty.weights, clean.weights) and torch.equal(dirty.keep, clean.keep)
    assert dirty.metrics == clean.metrics


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_huge_log_ratios_never_overflow(name: str, level: str, dtype: torch.dtype) -> None:
    # a -1e4 log-prob on either side: log ρ = ±9999 (exp overflows even float64 past 709)
    anchor = torch.tensor([[-1.0, -1.0], [-1e4, -1.0]], dtype=dtype)
    behaviour = torch.tensor([[-1e4, -1.0], [-1.0, -1.0]], dtype=dtype)
    result = OFF_POLICY_CORRECTIONS[name](
        anchor_log_probs=anchor, behaviour_log_probs=behaviour, response_mask=torch.ones(2, 2), level=level
    )
    assert torch.isfinite(result.weights).all() and torch.isfinite(result.keep).all()
    assert all(math.isfinite(v) for v in result.metrics.values())


def test_overflow_guard_values() -> None:
    anchor = torch.tensor([[-1.0], [-1e4]], dtype=torch.float64)
    behaviour = torch.tensor([[-1e4], [-1.0]], dtype=torch.float64)
    call = {"anchor_log_probs": anchor, "behaviour_log_probs": behaviour, "response_mask": torch.ones(2, 1)}
    # tis: min(e^9999, 2) = 2 and e^-9999 underflows to exactly 0
    torch.testing.assert_close(OFF_POLICY_CORRECTIONS["tis"](**call).weights, t([[2.0], [0.0]]))
    # decoupled unbounded: the exp(±20) guard, counted as truncated
    guarded = OFF_POLICY_CORRECTIONS["decoupled"](**call)
    torch.testing.assert_close(guarded.weights, t([[math.exp(20)], [math.exp(-20)]]))
    assert guarded.metrics["off_policy/truncated_frac"] == 1.0
    # mis: both outside [0.5, 2], dropped
    assert OFF_POLICY_CORRECTIONS["mis"](**call).metrics["off_policy/masked_frac"] == 1.0


def test_weights_carry_no_gradient() -> None:
    anchor = ANCHOR.clone().requires_grad_(True)
    for name in NAMES:
        result = OFF_POLICY_CORRECTIONS[name](
            anchor_log_probs=anchor, behaviour_log_probs=BEHAVIOUR, response_mask=MASK
        )
        assert not result.weights.requires_grad and not result.keep.requires_grad


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("tis", {"level": "turn"}, "unknown off-policy level 'turn'"),
        ("tis", {"cap": 0.0}, "tis cap must be > 0"),
        ("mis", {"lo": 2.0, "hi": 1.0}, "0 <= lo < hi"),
        ("decoupled", {"hi": 3.0}, "only with bound: mask or clamp"),
        ("decoupled", {"bound": "cut"}, "unknown decoupled bound 'cut'"),
    ],
)
def test_bad_arguments_raise(name: str, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        correct(name, **kwargs)


# --- config and data contract -----------------------------------------------------------------------

RECOMPUTE = "algorithm.old_log_probs=recompute"


def test_off_policy_config_defaults_and_a_valid_section() -> None:
    assert load_config().algorithm.off_policy.name == "none"
    cfg = load_config(
        None,
        [
            RECOMPUTE,
            "algorithm.off_policy.name=decoupled",
            "algorithm.off_policy.bound=mask",
            "algorithm.off_policy.level=sequence",
            "algorithm.off_policy.hi=5",
        ],
    )
    expected = {"name": "decoupled", "level": "sequence", "cap": None, "lo": None, "hi": 5.0, "bound": "mask"}
    assert cfg.algorithm.off_policy.model_dump() == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.off_policy.name=tis"], "off_policy.name 'tis' needs old_log_probs: recompute"),
        ([RECOMPUTE, "algorithm.off_policy.name=is"], "unknown off-policy correction 'is'"),
        ([RECOMPUTE, "algorithm.off_policy.name=mis", "algorithm.off_policy.cap=3"], "cap not used by"),
        ([RECOMPUTE, "algorithm.off_policy.name=tis", "algorithm.off_policy.bound=mask"], "bound not used"),
        ([RECOMPUTE, "algorithm.off_policy.name=decoupled", "algorithm.off_policy.lo=0.1"], "with bound"),
        ([RECOMPUTE, "algorithm.off_policy.name=mis", "algorithm.off_policy.lo=3"], "lo (3.0) must be below"),
        ([RECOMPUTE, "algorithm.off_policy.name=tis", "algorithm.off_policy.cap=0"], "greater than 0"),
        (["algorithm.off_policy.level=turn"], "algorithm.off_policy.level: Input should be"),
    ],
)
def test_bad_off_policy_config_is_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_batch_moves_the_sampler_log_probs() -> None:
    zeros = torch.zeros(1, 2)
    batch = Batch(
        input_ids=zeros,
        attention_mask=zeros,
        response_mask=zeros,
        sampler_log_probs=zeros,
        group_ids=zeros,
        prompt_lens=zeros,
    )
    assert batch.to("meta").sampler_log_probs.device.type == "meta"

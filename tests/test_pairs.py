"""`hone pairs`: preference pairs sampled from a model and labelled by the recipe's reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hone.cli import main
from hone.preference.pairs import pair_row, pairs_from_group
from hone.types import Rollout, Sample
from tests.helpers import tiny_overrides


def _rollout(text: str, reward: float) -> Rollout:
    return Rollout(
        sample_id="s",
        group_id=0,
        token_ids=[1, 2],
        prompt_len=1,
        loss_mask=[1],
        sampler_logprobs=[0.0],
        response_text=text,
        reward=reward,
    )


def test_best_pairs_with_worst_each_response_once() -> None:
    group = [
        _rollout("a", 1.0),
        _rollout("b", 0.0),
        _rollout("c", 0.5),
        _rollout("d", 0.9),
        _rollout("e", 0.2),
    ]
    pairs = pairs_from_group(group, per_prompt=3, min_margin=0.0)
    # ranked a(1.0) d(0.9) c(0.5) e(0.2) b(0.0): a-b, d-e; c is left alone (an odd count)
    assert [(c.response_text, r.response_text) for c, r in pairs] == [("a", "b"), ("d", "e")]


def test_no_pair_within_the_margin_nor_between_equal_texts() -> None:
    group = [_rollout("a", 1.0), _rollout("b", 0.7), _rollout("a", 0.0)]
    # the two "a"s are one response (its best score), so only a(1.0) vs b(0.7) remains: 0.3 apart
    assert [(c.response_text, r.response_text) for c, r in pairs_from_group(group, 1, 0.0)] == [("a", "b")]
    assert pairs_from_group(group, 1, min_margin=0.5) == []
    assert pairs_from_group([_rollout("x", 0.0), _rollout("y", 0.0)], 1, 0.0) == []  # equally wrong
    assert pairs_from_group([_rollout("x", 1.0), _rollout(" ", 0.0)], 1, 0.0) == []  # an empty response


def test_rows_are_trl_preference_format() -> None:
    chosen, rejected = _rollout("0412", 1.0), _rollout("0411", 0.0)
    plain = pair_row(Sample(id="1", prompt="045+367=", answer="0412"), chosen, rejected, conversational=False)
    assert plain == {
        "prompt": "045+367=",
        "chosen": "0412",
        "rejected": "0411",
        "answer": "0412",
        "chosen_reward": 1.0,
        "rejected_reward": 0.0,
    }
    chat = pair_row(Sample(id="1", prompt="2+2?", answer="4"), chosen, rejected, conversational=True)
    assert chat["prompt"] == [{"role": "user", "content": "2+2?"}]
    assert chat["chosen"] == [{"role": "assistant", "content": "0412"}]


def test_hone_pairs_writes_pairs_that_the_reward_ranks(tmp_path: Path, micro_model_dir: Path) -> None:
    out = tmp_path / "p.jsonl"
    code = main(
        [
            "pairs",
            *tiny_overrides(tmp_path, micro_model_dir, "pairs"),
            "reward.fn=tests.rewards_for_tests:token_id_reward",  # varies within almost every group
            "pairs.prompts=8",
            f"pairs.out={out}",
        ]
    )
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(rows) <= 8
    assert all(r["chosen_reward"] > r["rejected_reward"] and r["chosen"] != r["rejected"] for r in rows)
    assert all(r["prompt"].endswith("=") for r in rows)  # the arithmetic task's plain prompts
    assert not list(tmp_path.glob("*.partial"))


def test_no_pairs_is_one_line_and_no_file(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.jsonl"
    # The untrained micro model never answers: every reward is 0, so no group has a pair.
    code = main(
        ["pairs", *tiny_overrides(tmp_path, micro_model_dir, "none"), "pairs.prompts=4", f"pairs.out={out}"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no pairs from 4 prompts" in err[0]
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_eval_and_pairs_sample_over_the_policys_own_model(
    tmp_path: Path, micro_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing trains the policy in `hone eval` or `hone pairs`: the sampler takes the policy's model, no
    copy (one copy of the weights in memory, not two), and evaluates exactly as a sampler owning a copy."""
    from hone.config import load_config
    from hone.rl.components import build_components, close_samplers
    from hone.rl.evaluate import EvalSettings, run_eval
    from hone.rollout.engines import hf_engine

    copies: list[object] = []
    real_copy = hf_engine.sampler_model

    def counted_copy(policy: Any, dtype: str = "model") -> Any:
        copies.append(policy)
        return real_copy(policy, dtype)

    monkeypatch.setattr(hf_engine, "sampler_model", counted_copy)
    overrides = [*tiny_overrides(tmp_path, micro_model_dir, "own"), "data.eval_size=4"]
    out = tmp_path / "eval.json"
    assert main(["eval", *overrides, "--out", str(out)]) == 0
    reward = "reward.fn=tests.rewards_for_tests:token_id_reward"
    pairs = [reward, "pairs.prompts=4", f"pairs.out={tmp_path / 'p'}"]
    assert main(["pairs", *overrides, *pairs]) == 0
    assert copies == []
    parts = build_components(load_config(None, overrides))  # a training run's sampler: its own copy
    try:
        assert len(copies) == 1 and parts.sampler.model is not parts.policy.model  # type: ignore[attr-defined]
        assert run_eval(parts.evaluation, EvalSettings.of(load_config(None, overrides))) == json.loads(
            out.read_text()
        )
    finally:
        close_samplers(parts)

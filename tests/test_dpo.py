"""DPO: every loss trains, the margin grows, the cached and LoRA references, and `hone dpo` end to end."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hone.cli import main
from hone.tracking import read_metrics
from hone.training.adapter_reference import AdapterReference
from hone.training.dpo import DPOSettings, encode_preference, reference_log_probs, run_dpo, sequence_log_probs
from hone.training.policy import LoraSettings, Policy
from tests.conftest import LETTERS, char_tokenizer, tiny_qwen2
from tests.helpers import dpo_args, tiny_overrides

# "a=" prefers "bb" (the next letter) to "zz".
PAIRS = [(f"{c}=", LETTERS[i + 1] * 2, "zz") for i, c in enumerate(LETTERS[:6])]
TRL_METRICS = {
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
}


@pytest.fixture
def policy() -> Policy:
    torch.manual_seed(0)
    return Policy(tiny_qwen2(train_mode=True), char_tokenizer())


def encoded(policy: Policy) -> list:
    assert policy.tokenizer is not None
    return [encode_preference(policy.tokenizer, p, c, r) for p, c, r in PAIRS]


def frozen_copy(policy: Policy) -> Policy:
    reference = Policy(copy.deepcopy(policy.model).eval().requires_grad_(False), policy.tokenizer)
    return reference


def test_sequence_log_probs_sum_response_tokens_only(policy: Policy) -> None:
    pair = encoded(policy)[0]
    logps, lengths = sequence_log_probs(policy, [pair.chosen, pair.rejected], pad_id=0)
    assert lengths.tolist() == [3.0, 3.0]  # two letters and the eos
    ids = torch.tensor([pair.chosen[0]])
    with torch.no_grad():
        full = torch.log_softmax(policy.model(input_ids=ids).logits[0, :-1], -1)
    by_hand = sum(full[t, ids[0, t + 1]] for t in range(pair.chosen[1] - 1, len(pair.chosen[0]) - 1))
    assert logps[0].item() == pytest.approx(float(by_hand), abs=1e-5)


@pytest.mark.parametrize("loss", ["sigmoid", "cdpo", "ipo", "simpo"])
def test_every_loss_trains_and_the_margin_grows(policy: Policy, loss: str) -> None:
    rows: list[dict[str, float]] = []
    settings = DPOSettings(
        loss=loss,
        beta=2.0 if loss == "simpo" else 0.1,
        label_smoothing=0.1 if loss == "cdpo" else 0.0,
        batch_size=6,
        micro_batch_size=4,
        lr=3e-3,
        schedule="constant",
        steps=12,
    )
    reference = None if loss == "simpo" else frozen_copy(policy)
    result = run_dpo(policy, encoded(policy), settings, reference=reference, log=rows.append)
    assert result["steps"] == 12 and set(rows[0]) >= TRL_METRICS
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in rows)
    if loss != "simpo":  # the policy starts as its reference: implicit rewards 0, loss at its start value
        assert rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert rows[-1]["rewards/margins"] > rows[0]["rewards/margins"] + 0.05
    assert rows[-1]["rewards/accuracies"] == 1.0
    assert (
        rows[-1]["logps/chosen"] - rows[-1]["logps/rejected"]
        > rows[0]["logps/chosen"] - rows[0]["logps/rejected"]
    )


def test_cached_reference_trains_as_the_per_batch_one(policy: Policy) -> None:
    twin = Policy(copy.deepcopy(policy.model), policy.tokenizer)
    settings = DPOSettings(batch_size=4, lr=1e-2, steps=3, cache_reference=True)
    cached_rows: list[dict[str, float]] = []
    live_rows: list[dict[str, float]] = []
    run_dpo(policy, encoded(policy), settings, reference=frozen_copy(policy), log=cached_rows.append)
    run_dpo(
        twin,
        encoded(twin),
        DPOSettings(batch_size=4, lr=1e-2, steps=3, cache_reference=False),
        reference=frozen_copy(twin),
        log=live_rows.append,
    )
    for cached, live in zip(cached_rows, live_rows, strict=True):
        assert cached["loss"] == pytest.approx(live["loss"], abs=1e-5)
        assert cached["rewards/margins"] == pytest.approx(live["rewards/margins"], abs=1e-5)


@pytest.mark.parametrize("cache_reference", [True, False])
def test_lora_reference_is_the_base_with_the_adapter_disabled(
    micro_model_dir: Path, cache_reference: bool
) -> None:
    policy = Policy.from_pretrained(micro_model_dir, lora=LoraSettings(r=4, alpha=8))
    assert policy.tokenizer is not None
    pairs = [encode_preference(policy.tokenizer, p, c, r) for p, c, r in PAIRS]
    reference = AdapterReference(policy)
    base = AutoModelForCausalLM.from_pretrained(micro_model_dir)
    rows: list[dict[str, float]] = []
    run_dpo(
        policy,
        pairs,
        DPOSettings(batch_size=6, lr=1e-2, steps=4, cache_reference=cache_reference),
        reference=reference,
        log=rows.append,
    )
    # After training, the adapter-disabled forward still gives the untouched base model's log-probs.
    with torch.no_grad():
        ref_chosen, _ = reference_log_probs(reference, pairs, pad_id=0)
        base_chosen, _ = reference_log_probs(Policy(base, policy.tokenizer), pairs, pad_id=0)
    assert ref_chosen.tolist() == pytest.approx(base_chosen.tolist(), abs=1e-5)
    assert rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)  # LoRA's B starts at 0: π = ref
    assert rows[-1]["rewards/margins"] > 0


def test_a_loss_that_needs_a_reference_refuses_to_run_without(policy: Policy) -> None:
    with pytest.raises(ValueError, match="'sigmoid' needs a reference policy"):
        run_dpo(policy, encoded(policy), DPOSettings(steps=1))


def test_hone_dpo_logs_trl_metrics_evaluates_and_saves_a_loadable_model(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(dpo_args(tmp_path, micro_model_dir, "run")) == 0
    run_dir = tmp_path / "run"
    rows = read_metrics(run_dir / "metrics.jsonl")
    steps = [row for row in rows if "loss" in row]
    assert [row["step"] for row in steps] == list(range(1, 7)) and set(steps[0]) >= TRL_METRICS
    assert steps[-1]["rewards/margins"] > steps[0]["rewards/margins"]
    evals = [row for row in rows if "eval/accuracy" in row]
    assert [row["step"] for row in evals] == [0, 6]  # the recipe's dpo.eval: before and after
    assert (run_dir / "config.yaml").is_file()
    AutoModelForCausalLM.from_pretrained(run_dir / "model")
    out = capsys.readouterr().out
    assert "held-out accuracy after DPO" in out and str(run_dir / "model") in out


def test_hone_dpo_bad_row_is_one_line_before_any_training(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"prompt": "a=", "chosen": "bb", "rejected": "zz"})
        + "\n"
        + json.dumps({"prompt": "b="})
        + "\n"
    )
    args = dpo_args(tmp_path, micro_model_dir, "bad")
    code = main([*args, f"dpo.data={bad}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"hone: error: {bad} line 2: missing field 'chosen' (fields: ['prompt'])"]
    assert not (tmp_path / "bad").exists()


def test_hone_dpo_key_for_another_loss_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["dpo", "dpo", f"run.dir={tmp_path}", "dpo.loss=ipo", "dpo.simpo_gamma=1.0"])
    assert code == 2
    assert "dpo: simpo_gamma applies to loss simpo only, not 'ipo'" in capsys.readouterr().err


def test_hone_dpo_trains_on_conversational_pairs(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {
            "prompt": [{"role": "user", "content": f"{c}="}],
            "chosen": [{"role": "assistant", "content": LETTERS[i + 1] * 2}],
            "rejected": [{"role": "assistant", "content": "zz"}],
        }
        for i, c in enumerate(LETTERS[:6])
    ]
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = dpo_args(tmp_path, micro_model_dir, "chat", "dpo.eval=false", "dpo.loss=ipo")
    assert main([*args, f"dpo.data={chat}"]) == 0
    steps = read_metrics(tmp_path / "chat" / "metrics.jsonl")
    assert len(steps) == 6 and steps[-1]["rewards/margins"] > steps[0]["rewards/margins"]
    assert "held-out accuracy" not in capsys.readouterr().out  # dpo.eval off: no task evaluation


@pytest.mark.parametrize("command", ["dpo", "rm"])
def test_without_a_recipe_dpo_and_rm_read_the_pairs_hone_pairs_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    monkeypatch.chdir(tmp_path)  # no runs/pairs/pairs.jsonl here
    assert main([command, "logging.progress=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # The packaged recipe's relative path means the current directory; the error shows the path tried.
    assert err == [f"hone: error: {tmp_path / 'runs/pairs/pairs.jsonl'}: file not found"]
    assert not (tmp_path / "runs").exists()


def test_the_pairs_hone_pairs_writes_train_with_dpo_and_rm(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pairs.jsonl"
    sampled = [
        "pairs",
        *tiny_overrides(tmp_path, micro_model_dir, "pairs"),
        "reward.fn=tests.rewards_for_tests:token_id_reward",  # varies within almost every group
        "pairs.prompts=8",
        f"pairs.out={out}",
    ]
    assert main(sampled) == 0
    common = [
        f"run.dir={tmp_path}",
        "run.threads=1",
        "run.time_limit_s=null",
        f"model.path={micro_model_dir}",
        "logging.progress=false",
        "logging.tensorboard=false",
    ]
    assert main(["dpo", *common, "run.name=dpo", f"dpo.data={out}", "dpo.steps=2", "dpo.eval=false"]) == 0
    assert main(["rm", *common, "run.name=rm", f"rm.data={out}", "rm.steps=2"]) == 0
    assert len(read_metrics(tmp_path / "dpo" / "metrics.jsonl")) == 2
    assert "eval/pair_accuracy" in read_metrics(tmp_path / "rm" / "metrics.jsonl")[-1]

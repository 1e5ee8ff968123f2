"""`hone rm`: a reward model fitted to preference pairs, held-out accuracy logged, and the saved directory
scored by the `reward_model` reward (the round trip), plus the one-line refusals before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hone.cli import main
from hone.data import load_preferences
from hone.models import build_byte_tokenizer
from hone.preference.commands import split_held_out
from hone.rewards.model import reward_model
from hone.tracking import read_metrics
from hone.training.reward_model import (
    EncodedComparison,
    RMSettings,
    load_score_model,
    pair_accuracy,
    run_reward_model,
    sequence_rewards,
)
from hone.types import Rollout, Sample
from tests.conftest import LETTERS

# "a=" prefers "bb" (the next letter, twice) to "zz".
ROWS = [
    {"prompt": f"{c}=", "chosen": LETTERS[i + 1] * 2, "rejected": "zz"} for i, c in enumerate(LETTERS[:10])
]


def write_pairs(path: Path, rows: list[dict[str, str]] = ROWS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def conversational(row: dict[str, str]) -> dict[str, list[dict[str, str]]]:
    """The same pair in TRL's implicit-prompt conversational format."""
    user = {"role": "user", "content": row["prompt"]}
    return {key: [user, {"role": "assistant", "content": row[key]}] for key in ("chosen", "rejected")}


def rm_args(tmp_path: Path, model_dir: Path, name: str, *extra: str) -> list[str]:
    return [
        "rm",
        "rm",
        f"run.dir={tmp_path}",
        f"run.name={name}",
        "run.threads=1",
        "run.time_limit_s=null",
        f"model.path={model_dir}",
        f"rm.data={write_pairs(tmp_path / 'pairs.jsonl')}",
        "rm.steps=30",
        "rm.batch_size=8",
        "rm.lr=1e-3",
        "rm.eval_every=10",
        "rm.val_fraction=0.2",
        "logging.progress=false",
        "logging.tensorboard=false",
        *extra,
    ]


@pytest.mark.parametrize("chat", [False, True])
def test_hone_rm_logs_held_out_accuracy_and_its_model_loads_as_the_reward(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str], chat: bool
) -> None:
    args = rm_args(tmp_path, micro_model_dir, "rm")
    if chat:  # scored through the tokenizer's chat template, in training as by the reward
        args.append(f"rm.data={write_pairs(tmp_path / 'chat.jsonl', [conversational(r) for r in ROWS])}")
        args.append("model.gradient_checkpointing=true")  # the same numbers, recomputed in backward
    assert main(args) == 0
    run_dir = tmp_path / "rm"
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(1, 31))
    held_out = [row for row in rows if "eval/pair_accuracy" in row]
    assert [row["step"] for row in held_out] == [10, 20, 30]
    assert {"loss", "accuracy", "margin", "rewards/chosen", "rewards/rejected", "eval/loss"} <= set(
        held_out[0]
    )
    assert rows[-1]["loss"] < rows[0]["loss"]
    out = capsys.readouterr().out
    assert "held-out pair accuracy" in out and f"reward.args.path={run_dir / 'model'}" in out
    # The round trip: the reward RL would use scores every training pair's chosen response higher.
    scorer = reward_model(str(run_dir / "model"))
    samples = [
        Sample(f"s{i}", messages=[{"role": "user", "content": row["prompt"]}])
        if chat
        else Sample(f"s{i}", prompt=row["prompt"])
        for i, row in enumerate(ROWS)
    ]

    def scores(key: str) -> list[float]:
        rollouts = [
            Rollout(s.id, 0, [1], 1, [], [], response_text=row[key])
            for s, row in zip(samples, ROWS, strict=True)
        ]
        return scorer.score_batch(rollouts, samples)

    assert all(c > r for c, r in zip(scores("chosen"), scores("rejected"), strict=True))


def test_held_out_accuracy_counts_pairs_scored_the_right_way(micro_model_dir: Path) -> None:
    tokenizer = build_byte_tokenizer()
    model = load_score_model(micro_model_dir, dtype="auto", pad_token_id=tokenizer.pad_token_id)
    ids = [tokenizer(f"{c}=x").input_ids for c in LETTERS[:4]]
    pairs = [
        EncodedComparison(ids[0], ids[1]),
        EncodedComparison(ids[1], ids[0]),
        EncodedComparison(ids[2], ids[3]),
    ]
    scores = sequence_rewards(model, tokenizer, ids).tolist()
    expected = ((scores[0] > scores[1]) + (scores[1] > scores[0]) + (scores[2] > scores[3])) / 3
    assert pair_accuracy(model, tokenizer, pairs, micro_batch_size=2)["accuracy"] == pytest.approx(expected)


def test_run_reward_model_needs_held_out_pairs(micro_model_dir: Path) -> None:
    tokenizer = build_byte_tokenizer()
    model = load_score_model(micro_model_dir, dtype="auto", pad_token_id=tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="needs training pairs and held-out pairs"):
        run_reward_model(model, tokenizer, [EncodedComparison([2, 3], [2, 4])], [], RMSettings(steps=1))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["rm.data=null"], "rm.data: set the preference data, e.g. rm.data=runs/pairs/pairs.jsonl"),
        (["model.lora.r=4"], "model.lora: hone rm trains the whole model"),
    ],
)
def test_hone_rm_refuses_in_one_line_before_training(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    code = main(rm_args(tmp_path, micro_model_dir, "bad", *extra))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0]
    assert not (tmp_path / "bad").exists()


def test_hone_rm_bad_row_names_file_row_and_field(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_pairs(tmp_path / "bad.jsonl", [*ROWS[:3], {"prompt": "q=", "chosen": "ab", "rejected": "ab"}])
    code = main([*rm_args(tmp_path, micro_model_dir, "bad"), f"rm.data={bad}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        f"hone: error: {bad} line 4: fields 'chosen' and 'rejected' are identical; a pair must differ"
    ]


def test_held_out_split_is_seeded_disjoint_and_at_least_one(tmp_path: Path) -> None:
    pairs = load_preferences(str(write_pairs(tmp_path / "p.jsonl")))
    train, held_out = split_held_out(pairs, 0.2, seed=3)
    assert len(held_out) == 2 and len(train) == 8
    assert {p.sample.id for p in train}.isdisjoint(p.sample.id for p in held_out)
    assert split_held_out(pairs, 0.2, seed=3) == (train, held_out)
    assert len(split_held_out(pairs, 0.01, seed=3)[1]) == 1

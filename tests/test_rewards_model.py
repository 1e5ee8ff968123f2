"""Reward model: batched scores equal one-at-a-time scores whatever the padding, and loading errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from hone.models import build_byte_tokenizer
from hone.rewards.model import RewardModel, load_tokenizer, reward_model
from hone.rewards.registry import REWARDS
from hone.types import Rollout, Sample

RESPONSES = ["4", "The answer is 4.", "", "four, I think; or maybe five?", "x" * 40]


def save_reward_model(out: Path, *, num_labels: int = 1, pad: bool = True) -> Path:
    """A random 2-layer Qwen2 sequence classifier + the byte tokenizer (with a chat template)."""
    tokenizer = build_byte_tokenizer()
    if not pad:
        tokenizer.pad_token = None
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        num_labels=num_labels,
        initializer_range=0.5,  # large random logits, so that different texts get clearly different scores
        pad_token_id=tokenizer.pad_token_id if pad else None,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    # Saved in float64: tests that compare two batchings load it so (dtype="auto"), because in fp32 the
    # forward's reductions regroup with the batch shape and round differently on different CPUs.
    transformers.Qwen2ForSequenceClassification(config).double().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_reward_model(tmp_path_factory.mktemp("rm"))


def rollouts_and_samples(chat: bool) -> tuple[list[Rollout], list[Sample]]:
    rollouts = [Rollout(f"s{i}", 0, [1], 1, [], [], response_text=t) for i, t in enumerate(RESPONSES)]
    if chat:
        samples = [
            Sample(f"s{i}", messages=[{"role": "user", "content": f"what is {i}+2?"}]) for i in range(5)
        ]
    else:
        samples = [Sample(f"s{i}", prompt=f"Q: what is {i}+2?\nA: ") for i in range(5)]
    return rollouts, samples


def one_at_a_time(rm: RewardModel, rollouts: list[Rollout], samples: list[Sample]) -> list[float]:
    return [rm.score_batch([r], [s])[0] for r, s in zip(rollouts, samples, strict=True)]


@pytest.mark.parametrize("chat", [False, True])
def test_batched_scores_equal_single_scores(rm_dir: Path, chat: bool) -> None:
    rm = reward_model(str(rm_dir), batch_size=16, dtype="auto")
    rollouts, samples = rollouts_and_samples(chat)
    batched = rm.score_batch(rollouts, samples)
    single = one_at_a_time(rm, rollouts, samples)
    assert all(isinstance(s, float) for s in batched)
    # float64 forwards agree to ~1e-13; the scores are then rounded to fp32 (|score| < 16: ulp < 2e-6).
    assert batched == pytest.approx(single, abs=1e-5)
    assert max(batched) - min(batched) > 1e-2  # the scores do depend on the text


def test_left_padding_and_batch_size_splits_give_the_same_scores(rm_dir: Path) -> None:
    rollouts, samples = rollouts_and_samples(chat=False)
    reference = reward_model(str(rm_dir), batch_size=16, dtype="auto").score_batch(rollouts, samples)
    for batch_size in (1, 2, 3):  # float64 forwards, fp32 scores: see test_batched_scores_equal_single_scores
        split = reward_model(str(rm_dir), batch_size=batch_size, dtype="auto").score_batch(rollouts, samples)
        assert split == pytest.approx(reference, abs=1e-5)
    rm = reward_model(str(rm_dir), batch_size=2, dtype="auto")
    rm.tokenizer.padding_side = "left"
    assert rm.score_batch(rollouts, samples) == pytest.approx(reference, abs=1e-5)


def test_chat_template_is_used_for_messages_and_plain_text_for_prompts(rm_dir: Path) -> None:
    rm = reward_model(str(rm_dir))
    rollouts, samples = rollouts_and_samples(chat=True)
    text, templated = rm.text(rollouts[1], samples[1])
    assert templated and text == "user: what is 1+2?\nassistant: The answer is 4.<eos>\n"
    rollouts, samples = rollouts_and_samples(chat=False)
    assert rm.text(rollouts[1], samples[1]) == ("Q: what is 1+2?\nA: The answer is 4.", False)


def test_missing_pad_token_falls_back_to_eos(tmp_path: Path) -> None:
    rm = reward_model(str(save_reward_model(tmp_path, pad=False)), batch_size=8)
    assert rm.tokenizer.pad_token == "<eos>" and rm.model.config.pad_token_id == rm.tokenizer.eos_token_id
    for chat in (False, True):  # chat texts end in <eos>, the pad token: still the same either way
        rollouts, samples = rollouts_and_samples(chat)
        assert rm.score_batch(rollouts, samples) == pytest.approx(
            one_at_a_time(rm, rollouts, samples), abs=1e-5
        )


def test_truncation_keeps_the_end_of_the_text(rm_dir: Path) -> None:
    rm = reward_model(str(rm_dir), max_length=8)
    long = [Rollout("a", 0, [1], 1, [], [], response_text="...the end")]
    short = [Rollout("a", 0, [1], 1, [], [], response_text=".the end")]
    assert rm.score_batch(long, [Sample("a", prompt="a long prompt")]) == pytest.approx(
        rm.score_batch(short, [Sample("a", prompt="")]), abs=1e-5
    )


def test_registered_name_builds_it(rm_dir: Path) -> None:
    rm = REWARDS["reward_model"](path=str(rm_dir), batch_size=4, device="cpu")
    assert isinstance(rm, RewardModel) and rm.batch_size == 4
    rollouts, samples = rollouts_and_samples(chat=False)
    assert len(rm.score_batch(rollouts, samples)) == len(rollouts)


def test_multi_label_heads_need_a_label_index(tmp_path: Path) -> None:
    path = str(save_reward_model(tmp_path, num_labels=3))
    with pytest.raises(ValueError, match="has 3 labels; a reward model has 1"):
        reward_model(path)
    with pytest.raises(ValueError, match="label_index 3 out of range"):
        reward_model(path, label_index=3)
    rollouts, samples = rollouts_and_samples(chat=False)
    rm = reward_model(path, label_index=2)
    logits = rm.model(**rm.tokenizer(samples[0].prompt + RESPONSES[0], return_tensors="pt")).logits
    assert rm.score_batch(rollouts[:1], samples[:1]) == pytest.approx([logits[0, 2].item()], abs=1e-5)


def test_missing_path_and_bad_arguments_fail_clearly(tmp_path: Path, rm_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"reward model: model directory not found: .*nope"):
        reward_model(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        reward_model(str(rm_dir), batch_size=0)
    with pytest.raises(ValueError, match="got 2 rollouts but 1 samples"):
        reward_model(str(rm_dir)).score_batch(rollouts_and_samples(chat=False)[0][:2], [Sample("x")])


def test_load_tokenizer_without_pad_or_eos_is_an_error(tmp_path: Path) -> None:
    tokenizer = build_byte_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token = None
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="neither a pad nor an eos token"):
        load_tokenizer(str(tmp_path), padding_side="right")


def test_a_causal_lm_without_a_score_head_is_refused_naming_the_path(micro_model_dir: Path) -> None:
    # transformers would load it with a randomly initialised `score` head and score noise.
    with pytest.raises(
        ValueError,
        match=rf"reward model at '{micro_model_dir}' has no trained score head \(missing score.weight\)",
    ):
        reward_model(str(micro_model_dir))


def test_a_checkpoint_missing_body_weights_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    directory = save_reward_model(tmp_path / "rm")
    weights = load_file(directory / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"lacks 1 weight tensors \(e.g. model.norm.weight\): a damaged checkpoint"
    ):
        reward_model(str(directory))

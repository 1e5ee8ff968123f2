"""Prompt rendering: plain text, the chat template, and `data.system_prompt`."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from hone.config import load_config
from hone.models import build_tiny_model
from hone.preference.pairs import pair_row
from hone.rollout.prompts import encode_prompt, render_prompt
from hone.types import Rollout, Sample

SYSTEM = "Answer inside <answer></answer>."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


def test_system_prompt_opens_a_chat_prompt(tokenizer) -> None:
    sample = Sample(id="a", prompt="2+2=", answer="4")
    assert render_prompt(sample, tokenizer, True) == "user: 2+2=\nassistant: "
    with_system = render_prompt(sample, tokenizer, True, SYSTEM)
    assert with_system == f"system: {SYSTEM}\nuser: 2+2=\nassistant: "
    # What the sampler is given (a single-turn episode's prompt) is exactly that text's tokens.
    ids, _ = encode_prompt(sample, tokenizer, True, SYSTEM)
    assert ids == tokenizer(with_system, add_special_tokens=False)["input_ids"]


def test_a_sample_with_its_own_system_message_keeps_it(tokenizer) -> None:
    own = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2="}]
    sample = Sample(id="a", messages=own, answer="4")
    assert render_prompt(sample, tokenizer, True, SYSTEM) == "system: Be terse.\nuser: 2+2=\nassistant: "
    # A chat without one gets it.
    chat = Sample(id="b", messages=own[1:], answer="4")
    assert render_prompt(chat, tokenizer, True, SYSTEM).startswith(f"system: {SYSTEM}\n")


def test_pairs_record_the_chat_the_policy_saw() -> None:
    sample = Sample(id="a", prompt="2+2=", answer="4")
    chosen, rejected = (
        Rollout("a", 0, [7, 8], 1, [1], [0.0], response_text=text, reward=reward)
        for text, reward in (("4", 1.0), ("5", 0.0))
    )
    row = pair_row(sample, chosen, rejected, True, SYSTEM)
    assert row["prompt"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "2+2="}]


@pytest.mark.parametrize(
    "overrides",
    [["data.system_prompt=x"], ["data.system_prompt=x", "data.chat_template=true", "env.name=guess_number"]],
)
def test_system_prompt_without_a_single_turn_chat_is_refused(overrides: list[str]) -> None:
    with pytest.raises(ValueError, match=r"data\.system_prompt needs data\.chat_template: true"):
        load_config("default", overrides)

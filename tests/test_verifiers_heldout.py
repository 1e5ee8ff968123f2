"""A held-out check of the verifiers adapter: a taskset verifiers ships (`verifiers.v1.tasksets.textarena`,
TextArena's Hangman through the `textarena` PyPI package), loaded by its built-in id and played offline
through `env.name: verifiers:textarena` — token-exact episodes scored by verifiers' own rubric.

TextArena's word games read NLTK's `words` corpus (which NLTK downloads on first use); the test gives them
a two-word corpus of its own and turns the download into a no-op, so nothing reaches the network and the
secret word is one of two known ones (which one: the task's seed, as the board in its prompt shows)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from hone.envs import make_env
from hone.envs.base import Environment
from hone.rewards import RewardScorer
from hone.rewards.env import env_reward
from hone.rollout.multiturn import EpisodeLimits, run_episodes
from hone.types import Rollout, Sample, SamplingParams
from tests.helpers import Scripted

pytest.importorskip("verifiers.v1")
pytest.importorskip("textarena")
nltk = pytest.importorskip("nltk")

HANGMAN = "verifiers:textarena"
WORDS = ["hone", "train"]  # the corpus: a secret's board has as many columns as it has letters
MISSES = ["[Q]", "[Z]", "[X]", "[J]", "[K]", "[V]"]  # in neither word: six of them lose the game


@pytest.fixture(scope="module")
def hangman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[type[Environment]]:
    corpus = tmp_path_factory.mktemp("nltk_data")
    (corpus / "corpora" / "words").mkdir(parents=True)
    for fileid in ("en", "en-basic"):
        (corpus / "corpora" / "words" / fileid).write_text("".join(f"{w}\n" for w in WORDS))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nltk, "download", lambda *args, **kwargs: True)
        patch.setattr(nltk.data, "path", [str(corpus), *nltk.data.path])
        env = type(make_env(HANGMAN, {"game": "Hangman-v0"})())
        yield env


def _secret(sample: Sample) -> str:
    """The word the task's board hides: the one with as many letters as the board has columns."""
    columns = sample.messages[-1]["content"].split("Current board:\n\n")[1].splitlines()[0].split()
    assert columns[0] == "C00"
    (word,) = [w for w in WORDS if len(w) == len(columns)]
    return word


def _play(
    env: type[Environment], tok: PreTrainedTokenizerBase, sample: Sample, replies: list[str]
) -> Rollout:
    limits = EpisodeLimits(max_turns=8, max_tokens_per_turn=16, max_total_tokens=2048)
    (rollout,) = run_episodes(Scripted(tok, replies), tok, env, [sample], SamplingParams(n=1), limits)
    assert rollout.metrics["env/errors"] == 0.0
    metrics = RewardScorer(env_reward()).score([rollout], {sample.id: sample})  # reward.fn: env
    assert metrics["reward/game_reward"] == rollout.reward  # the rubric's one reward, logged
    return rollout


def test_verifiers_textarena_hangman_plays_token_for_token_and_its_rubric_scores_it(
    hangman: type[Environment], micro_model_dir: Path
) -> None:
    from verifiers.v1.tasksets.textarena import TextArenaEnv

    from hone.training.policy import Policy

    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    assert isinstance(hangman.vf_env, TextArenaEnv)  # type: ignore[attr-defined]
    samples = hangman.make_samples(8, 0, "train")
    secrets = [_secret(s) for s in samples]
    assert set(secrets) == set(WORDS)  # the seeds deal both words: the board is the seeded game's
    sample = samples[secrets.index("hone")]
    assert sample.meta["verifiers_task"]["info"]["game"] == "Hangman-v0"

    # A win: a right letter, then the word. The engine (reseeded from the task) hides the prompt's word.
    replies = ["[E]", "[HONE]"]
    won = _play(hangman, tok, sample, replies)
    assert won.reward == 1.0 and won.reward_parts == {"game_reward": 1.0}
    assert won.metrics["episode/turns"] == 2.0
    # The micro model's template renders "role: content" turns: the prompt is verifiers' opening (its
    # system prompt and the seeded board), the game's answer the masked user turn between the replies.
    prompt = tok.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
    assert won.token_ids[: won.prompt_len] == tok.encode(prompt, add_special_tokens=False)
    assert sample.messages[0]["content"].startswith("You are a competitive game player.")
    board = "C00 C01 C02 C03\n  _   _   _   E"  # the E revealed in the 4th column
    assert won.messages is not None and won.messages[-2] == {"role": "user", "content": board}
    first, last = ([*tok.encode(r, add_special_tokens=False), tok.eos_token_id] for r in replies)
    observation = tok.encode(f"\nuser: {board}\nassistant: ", add_special_tokens=False)
    assert won.response_ids == first + observation + last
    assert won.loss_mask == [1] * len(first) + [0] * len(observation) + [1] * len(last)

    # A loss: six letters in neither word, the game's own end (0 letters found: reward 0).
    lost = _play(hangman, tok, sample, MISSES)
    assert lost.reward == 0.0 and lost.reward_parts == {"game_reward": 0.0}
    assert lost.metrics["episode/turns"] == 6.0 and lost.metrics["episode/truncated"] == 0.0
    assert sum(lost.loss_mask) == 6 * (len(tok.encode("[Q]", add_special_tokens=False)) + 1)

    # Partial credit, as the engine computes it: two of five letters of "train" found, then six misses.
    other = samples[secrets.index("train")]
    partial = _play(hangman, tok, other, ["[T]", "[N]", *MISSES])
    assert partial.reward == pytest.approx(0.4) and partial.reward_parts == {
        "game_reward": pytest.approx(0.4)
    }

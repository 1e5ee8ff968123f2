"""The verifiers adapter (`env.name: verifiers:<id>`): samples from the environment's taskset, episodes played
by verifiers' own hooks with Hone's sampler, the rubric as the reward, one-line set-up errors, counted
runtime failures, and a few training steps of the ported guess_number game."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers.v1")

from hone.config import load_config
from hone.envs import GuessNumber, make_env
from hone.envs.base import Environment, StepResult
from hone.rewards import RewardScorer
from hone.rewards.env import env_reward
from hone.rollout.multiturn import EpisodeLimits, run_episodes
from hone.types import Sample, SamplingParams
from tests.helpers import Scripted

SINGLE = "verifiers:tests.vf_envs_for_tests"
GUESS = "verifiers:hone.envs.vf_guess_number"


class OutOfMoves(BaseException):
    """A scripted model with no move left (a BaseException, as Hone's own limit is)."""


@pytest.fixture(scope="module")
def single() -> type[Environment]:
    return type(make_env(SINGLE, {"n": 40})())


def test_samples_are_the_taskset_tasks_split_by_task_key(single: type[Environment]) -> None:
    train = single.make_samples(100, 0, "train")
    held_out = single.make_samples(100, 0, "eval")
    questions = [s.messages[-1]["content"] for s in train + held_out]
    # every task once, in one split or the other (no eval_args: a hash split by task key)
    assert sorted(questions) == sorted(f"What is {i}+1?" for i in range(40))
    assert 0 < len(held_out) < len(train)
    first = train[0]
    assert first.messages[0] == {"role": "system", "content": "Answer with a number."}
    assert first.answer == str(int(first.messages[1]["content"].split()[2].split("+")[0]) + 1)


def test_a_prompt_written_as_a_list_of_messages_loads_and_round_trips() -> None:
    """verifiers' own multi-turn examples (color_codeword) write the prompt as messages whose `role` is a
    default; the task stored in the sample must keep it, or loading it back fails on the role union."""
    from tests.vf_envs_for_tests import SumData

    env = type(make_env(SINGLE, {"n": 8, "messages": True})())
    sample = env.make_samples(4, 0, "train")[0]
    assert sample.messages[-1]["role"] == "user" and sample.messages[-1]["content"].startswith("What is")
    data = SumData.model_validate(sample.meta["verifiers_task"])
    assert data.prompt[0].role == "user"  # type: ignore[union-attr]


def test_unreadable_image_content_is_refused_in_one_line_naming_the_task() -> None:
    # Image content is read (tests/test_vision_agents.py); an empty data: URL or a remote one is refused.
    for url, why in [("data:,", "holds no data"), ("https://example.com/a.png", "not a data: URL")]:
        env = type(make_env(SINGLE, {"n": 8, "image": True, "image_url": url})())
        with pytest.raises(
            ValueError, match=rf"task 'verifiers-train-0-0': a user message's image: .*{why}"
        ) as info:
            env.make_samples(4, 0, "train")
        assert "\n" not in str(info.value)


async def _verifiers_own_score(sample: Sample, reply: str) -> tuple[dict[str, float], float]:
    """The same completion scored by verifiers alone: its task, its trace, its message graph, its scoring."""
    import verifiers.v1 as vf
    from verifiers.v1.graph import prepare_turn

    from tests.vf_envs_for_tests import SumData, SumTask

    task = SumTask(SumData.model_validate(sample.meta["verifiers_task"]))
    trace = vf.Trace(
        task=vf.TraceTask(type="SumTask", data=task.data), agent=vf.AgentInfo(config=vf.AgentConfig())
    )
    prompt = [vf.SystemMessage(content=task.data.system_prompt), vf.UserMessage(content=task.data.prompt)]
    response = vf.Response(
        id="x", created=0, model="m", message=vf.AssistantMessage(content=reply), finish_reason="stop"
    )
    prepare_turn(trace, prompt).commit(response)
    await task.score(trace)
    return {name: r.score for name, r in trace.rewards.items()}, trace.reward


def test_the_rubric_is_the_reward_each_function_logged_and_the_total_verifiers_own(
    single: type[Environment], micro_model_dir: Path
) -> None:
    from hone.training.policy import Policy

    tokenizer = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    samples = single.make_samples(1, 0, "train")
    right = samples[0].answer
    assert right is not None
    # three replies: right and brief (1 + 0.5), wrong but brief (0.5), wrong and long (0)
    for reply, expected in [(right, 1.5), ("99", 0.5), ("no idea at all", 0.0)]:
        rollouts = run_episodes(
            Scripted(tokenizer, [reply]),
            tokenizer,
            make_env(SINGLE, {"n": 40}),
            samples,
            SamplingParams(n=1, max_new_tokens=16),
            EpisodeLimits(max_turns=2, max_tokens_per_turn=16),
        )
        metrics = RewardScorer(env_reward()).score(rollouts, {s.id: s for s in samples})
        parts, total = asyncio.run(_verifiers_own_score(samples[0], reply))
        assert rollouts[0].reward == total == expected
        assert rollouts[0].reward_parts == parts
        assert metrics["reward/correct"] == parts["correct"] and metrics["reward/brief"] == parts["brief"]
        assert rollouts[0].metrics["episode/turns"] == 1.0  # single-turn: the environment ended it


def test_a_guess_number_episode_sees_what_the_built_in_game_shows_for_the_same_moves() -> None:
    ported = make_env(GUESS, {"high": 64, "eval_args": {"split": "eval"}})
    game = type(ported())
    ported_samples = game.make_samples(8, 3, "train")
    built_in_samples = GuessNumber.make_samples(8, 3, "train", high=64)
    assert [s.meta["verifiers_task"]["secret"] for s in ported_samples] == [
        s.meta["secret"] for s in built_in_samples
    ]
    rng = random.Random(0)

    async def play(env: Environment, sample: Sample, moves: list[str]) -> list[tuple]:
        """The built-in game stepped move by move: what it shows after each (messages, done, reward)."""
        start = env.reset(sample)
        seen: list[tuple] = [
            tuple(m["content"] for m in (await start if asyncio.iscoroutine(start) else start))
        ]
        for move in moves:
            result = env.step(move)
            result = await result if asyncio.iscoroutine(result) else result
            # what the model sees (messages are ignored once done), whether it is over, and the reward
            seen.append(([] if result.done else result.messages, result.done, result.reward))
            if result.done:
                break
        return seen

    async def plays_itself(env: Environment, sample: Sample, moves: list[str]) -> list[tuple]:
        """The port playing itself, its model calls answered by `moves`: the same record."""
        replies, seen = iter(moves), []

        async def chat(messages: list[dict], info: object = None) -> str:
            if seen:  # the game's answer to the last move: not over, no reward yet
                seen.append((messages, False, 0.0))
            else:
                seen.append(tuple(m["content"] for m in messages))
            move = next(replies, None)
            if move is None:
                raise OutOfMoves
            return move

        try:
            end = await env.play(sample, chat)  # type: ignore[attr-defined]
        except OutOfMoves:
            return seen
        return [*seen, ([], True, end.reward)]

    endings = set()
    for mine, theirs in zip(ported_samples, built_in_samples, strict=True):
        secret = theirs.meta["secret"]
        # random guesses, replies without a number, and the secret somewhere (or never: out of turns)
        moves = [
            rng.choice([str(rng.randint(1, 64)), "hmm", f"maybe {rng.randint(1, 64)}?"]) for _ in range(9)
        ]
        if rng.random() < 0.7:
            moves.insert(rng.randint(0, 7), str(secret))
        ours = asyncio.run(plays_itself(ported(), mine, moves))
        built_in = asyncio.run(play(GuessNumber(high=64), theirs, moves))
        assert ours == built_in
        endings.add((len(ours) - 1, ours[-1][2]))  # (turns played, final reward)
    # both ways a game ends were played: found (reward 1) and out of turns (8 turns, reward 0)
    assert (8, 0.0) in endings and any(reward == 1.0 for _, reward in endings)


def test_set_up_errors_are_one_line_naming_the_environment() -> None:
    # the environment's taskset failing as it loads its tasks (high < 2), when the run draws its samples
    with pytest.raises(ValueError) as info:
        type(make_env(GUESS, {"high": 1})()).make_samples(4, 0, "train")
    assert "\n" not in str(info.value) and GUESS in str(info.value) and "need high >= 2" in str(info.value)
    cases = {
        "verifiers:no_such_env_xyz": ({}, "no_such_env_xyz"),
        "verifiers:tests.no_such_module": ({}, "cannot import 'tests.no_such_module'"),
        SINGLE: ({"n": 3, "rows": 4}, "env.args.rows: Extra inputs are not permitted"),
        GUESS: ({"eval_args": {"split": "test"}}, "env.args.split: Input should be 'train' or 'eval'"),
    }
    for spec, (args, expected) in cases.items():
        with pytest.raises(ValueError) as info:
            make_env(spec, args)
        message = str(info.value)
        assert "\n" not in message and expected in message and spec in message


def test_an_environment_that_fails_is_counted_in_env_errors_and_the_episode_ends(
    micro_model_dir: Path,
) -> None:
    from dataclasses import replace

    from hone.training.policy import Policy

    broken, fine = (
        make_env("verifiers:tests.vf_broken_for_tests", {}),
        make_env("verifiers:tests.vf_envs_for_tests", {}),
    )
    sample = replace(type(broken()).make_samples(1, 0, "train")[0], id="broken")

    async def answer(messages: list[dict], info: object = None) -> str:
        return "1"

    with pytest.raises(RuntimeError, match="the game server is down") as failure:
        asyncio.run(broken().play(sample, answer))  # type: ignore[attr-defined]
    assert "\n" not in str(failure.value) and "tests.vf_broken_for_tests" in str(failure.value)

    class EitherEnv(Environment):  # the broken environment for the "broken" sample, the working one else
        def reset(self, s: Sample) -> list:
            raise NotImplementedError

        def step(self, text: str) -> StepResult:
            raise NotImplementedError

        async def play(self, s: Sample, chat: Any) -> StepResult:
            return await (broken if s.id == "broken" else fine)().play(s, chat)  # type: ignore[attr-defined]

    # Through the rollout loop: that episode ends, counted in env/errors, beside one that did not fail.
    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    ok_sample = replace(type(fine()).make_samples(1, 0, "train")[0], id="fine")
    limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=4, max_total_tokens=512)
    failed, ok = run_episodes(
        Scripted(tok, ["1", "1"]), tok, EitherEnv, [sample, ok_sample], SamplingParams(n=1), limits
    )
    assert failed.metrics["env/errors"] == 1.0 and ok.metrics["env/errors"] == 0.0


def test_agent_guess_verifiers_trains_a_few_steps_with_sft_from_the_ports_demonstrations(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    from hone.rl.loop import train
    from tests.helpers import tiny_overrides

    overrides = tiny_overrides(
        tmp_path,
        micro_model_dir,
        "agent-vf",
        **{
            "env.args": "{high: 8, demo_spread: 0.5, eval_args: {split: eval}}",
            "env.max_turns": 5,  # the game's own limit for high 8 (bit_length 4 + slack 1)
            "env.max_tokens_per_turn": 3,
            "data.eval_size": 8,
            "run.steps": 2,
            "sft.enabled": "true",
            "sft.max_steps": 2,
            "sft.examples": 16,
            "sft.val_size": 4,
            "sft.eval_every": 1,
        },
    )
    result = train(load_config("agent-guess-verifiers", overrides))
    assert result.steps == 2
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    step = rows[-1]
    assert {"reward/found", "env/invalid", "loss/policy", "eval/accuracy"} <= set(step)
    assert step["reward/found"] == step["reward/mean"]  # one reward of weight 1: the total is it
    assert 1 <= step["episode/turns"] <= 5
    assert step.get("env/errors", 0.0) == 0.0


def test_episodes_hone_cuts_short_report_the_rubric_as_zero(
    micro_model_dir: Path,
) -> None:
    from hone.training.policy import Policy

    tokenizer = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    factory = make_env(GUESS, {"high": 64, "eval_args": {"split": "eval"}})
    samples = type(factory()).make_samples(2, 0, "train")
    # two wrong turns, then Hone's turn limit: the game (8 turns) is still waiting for a reply
    rollouts = run_episodes(
        Scripted(tokenizer, ["100", "100"]),
        tokenizer,
        factory,
        samples,
        SamplingParams(n=1, max_new_tokens=4),
        EpisodeLimits(max_turns=2, max_tokens_per_turn=4),
    )
    metrics = RewardScorer(env_reward()).score(rollouts, {s.id: s for s in samples})
    assert all(r.metrics["episode/truncated"] == 1.0 and r.reward == 0.0 for r in rollouts)
    assert metrics["reward/found"] == 0.0  # reported (as 0), not missing from the mean
    assert [m["content"] for m in rollouts[0].messages if m["role"] == "user"][1:] == ["lower"]


def test_the_ports_demonstrations_are_the_built_in_games_scripted_games() -> None:
    ported = make_env(GUESS, {"high": 64, "demo_spread": 0.5, "eval_args": {"split": "eval"}})
    mine = type(ported()).make_samples(20, 7, "train")
    theirs = GuessNumber.make_samples(20, 7, "train", high=64)
    built_in = GuessNumber(high=64, demo_spread=0.5)
    demos = [
        (ported().demonstration(a), built_in.demonstration(b)) for a, b in zip(mine, theirs, strict=True)
    ]
    assert all(ours == theirs for ours, theirs in demos)
    assert len({len(ours) for ours, _ in demos}) > 1  # spread: games of different lengths, not one script

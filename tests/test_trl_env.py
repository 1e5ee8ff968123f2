"""TRL's environments run unchanged (issue 49, item 3): a class written for TRL 1.16's
`GRPOTrainer(environment_factory=...)` (`tests.trl_envs_for_tests`, written as TRL's docs write them) is a
Hone environment by its dotted path: its public methods are the tools (TRL's schemas), `reset(**row)` gets
the dataset row and its string is appended to the prompt, tool calls run and fail as TRL runs them,
`get_reward` is a reward component named after the class, TRL-contract rewards read `environments=`, and
`env.name: trl` routes rows among several by their `environment` column. One episode test and one short
training run are `integration`; the rest builds the adapter and scorer alone."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import pickle
from pathlib import Path
from typing import Any

import pytest
from transformers.utils import get_json_schema

from hone.config import load_config
from hone.data.splits import answer_needed_by_recipe
from hone.envs import Environment, TrlEnv, env_reads_answer, make_env
from hone.envs.trl_env import is_trl_env, trl_env_rewards
from hone.rewards import RewardScorer
from hone.rewards.resolve import load_reward
from hone.types import Rollout, Sample
from tests import trl_envs_for_tests as envs

MOD = "tests.trl_envs_for_tests"
COUNTER = f"{MOD}:CounterEnv"


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def step(env: Environment, text: str) -> Any:
    result = env.step(text)
    return asyncio.run(result) if inspect.isawaitable(result) else result


def counter_sample(target: int = 3, sid: str = "s0") -> Sample:
    return Sample(sid, messages=[{"role": "user", "content": "Count."}], meta={"target": target, "level": 1})


def played(env: TrlEnv, sample: Sample, replies: list[str]) -> Rollout:
    """Play `replies` against `env` as the rollout loop does; a rollout carrying the episode's instance."""
    env.reset(sample)
    for reply in replies:
        if step(env, reply).done:
            break
    r = Rollout(sample.id, 0, [1, 2, 3], 2, [1], [-0.1], response_text=replies[-1])
    r.env_state = env.reward_state()
    return r


def scorer(*overrides: str, make: Any = None) -> RewardScorer:
    cfg = load_config(None, ["reward.fn=null", *overrides])
    return load_reward(cfg.reward, None, env_rewards=trl_env_rewards(make))


# --- the class, wrapped -----------------------------------------------------------------------------


def test_a_dotted_path_to_a_trl_class_is_wrapped_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hone"):
        env = make_env(COUNTER)()
    assert isinstance(env, TrlEnv) and isinstance(env.instance, envs.CounterEnv)
    (line,) = [r.getMessage() for r in caplog.records if "TRL environment" in r.getMessage()]
    assert line == (
        f"environment {COUNTER}: TRL environment (reset(**row), tools double, increment, note, "
        "get_reward as reward CounterEnv)"
    )
    assert make_env(COUNTER)().instance is not env.instance  # one instance per episode


def test_tools_are_the_public_methods_with_the_schemas_trl_renders() -> None:
    env = make_env(COUNTER)()
    instance = env.instance
    # TRL hands the chat template the bound methods; transformers turns each into this schema.
    expected = [get_json_schema(getattr(instance, name)) for name in ("double", "increment", "note")]
    assert env.tools == expected
    assert expected[1]["function"]["parameters"] == {
        "type": "object",
        "properties": {"step": {"type": "integer", "description": "Value to add to the counter."}},
        "required": ["step"],
    }
    assert "reset" not in json.dumps(env.tools) and "get_reward" not in json.dumps(env.tools)


def test_a_factory_function_is_wrapped_too_and_read_without_building_a_class() -> None:
    env = make_env(f"{MOD}:make_counter")()
    assert isinstance(env, TrlEnv) and isinstance(env.instance, envs.CounterEnv)
    assert is_trl_env(f"{MOD}:make_counter") and is_trl_env(COUNTER) and is_trl_env("trl")
    assert not is_trl_env("guess_number") and not is_trl_env(None) and not is_trl_env("no.such:Env")


def test_a_class_without_reset_or_with_an_undocumented_tool_is_one_line_at_setup() -> None:
    with pytest.raises(ValueError) as e:
        make_env(f"{MOD}:NoReset")
    assert "\n" not in str(e.value) and "not an Environment" in str(e.value) and "no reset" in str(e.value)
    with pytest.raises(ValueError) as e:
        make_env(f"{MOD}:Undocumented")
    assert "\n" not in str(e.value) and "TRL environment Undocumented" in str(e.value)


# --- reset ------------------------------------------------------------------------------------------


def test_reset_gets_the_row_and_its_string_is_appended_to_the_last_message() -> None:
    envs.CounterEnv.resets.clear()
    env = make_env(COUNTER, answer_field="solution")()
    sample = Sample(
        "s0",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count."}],
        answer="3",
        meta={"target": 3, "level": 1},
    )
    messages = env.reset(sample)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Count. Reach 3."},  # TRL concatenates: no separator of its own
    ]
    # Every column, the prompt as the row holds it, the answer back under its column's name.
    assert envs.CounterEnv.resets == [
        {"target": 3, "level": 1, "solution": "3", "prompt": sample.messages},
    ]
    assert sample.messages[-1]["content"] == "Count."  # the sample is left as it was

    text = Sample("s1", prompt="Count to 2.", meta={"target": 2})
    assert env.reset(text) == [{"role": "user", "content": "Count to 2. Reach 2."}]
    assert envs.CounterEnv.resets[-1]["prompt"] == "Count to 2."
    echo = make_env(f"{MOD}:EchoEnv")()  # reset returns None: the prompt as it is
    assert echo.reset(text) == [{"role": "user", "content": "Count to 2."}]


def test_a_trl_environment_needs_no_answer_column() -> None:
    cfg = load_config(
        None, ["data.task=null", "data.source=x.jsonl", "reward.fn=null", f"env.name={COUNTER}"]
    )
    assert not env_reads_answer(COUNTER) and not env_reads_answer("trl")
    assert not env_reads_answer(f"{MOD}:make_counter")  # a factory function: what it builds tells
    assert env_reads_answer("guess_number") and env_reads_answer("no.such.module:Env")
    assert answer_needed_by_recipe(cfg, env_reads_answer=False) is None
    assert answer_needed_by_recipe(cfg) == f"env.name {COUNTER}"  # a Hone environment may check it


# --- tool calls -------------------------------------------------------------------------------------


def test_a_tool_call_runs_and_its_result_is_trls_str() -> None:
    env = make_env(COUNTER)()
    env.reset(counter_sample())
    result = step(env, "Let me add. " + call("increment", step=2))
    assert not result.done
    assert result.messages == [{"role": "tool", "name": "increment", "content": "2"}]
    assert env.instance.counter == 2
    assert step(env, call("note", text="x")).messages[0]["content"] == "None"  # str(None), as TRL sends it
    assert step(env, "I reached 2.").done  # no tool call: the episode ends


def test_a_tool_that_raises_an_unknown_tool_and_bad_json_answer_trls_error_dict() -> None:
    env = make_env(COUNTER)()
    env.reset(counter_sample())
    result = step(env, call("increment", step=-1) + call("jump") + "<tool_call>{oops</tool_call>")
    contents = [m["content"] for m in result.messages]
    assert contents[0] == "{'error': 'step must be positive'}"  # str({"error": str(e)})
    assert contents[1] == "{'error': 'Tool jump not found.'}"  # TRL's words
    assert contents[2].startswith("{'error': 'tool call is not valid JSON")
    assert result.info == {"tool_calls": 3.0, "tool_errors": 3.0, "tool_timeouts": 0.0}
    wrong = step(env, call("increment", stride=1)).messages[0]["content"]  # arguments are not checked first
    assert wrong.startswith("{'error': ") and "unexpected keyword argument 'stride'" in wrong

    word = make_env(f"{MOD}:WordEnv")()
    word.reset(Sample("w", prompt="Play."))
    for _ in range(3):
        step(word, call("guess", word="dog"))
    assert step(word, call("guess", word="cat")).messages[0]["content"] == "{'error': 'Game over.'}"


def test_sync_calls_run_in_order_before_a_turns_async_ones_messages_stay_in_order() -> None:
    env = make_env(COUNTER)()
    env.reset(counter_sample())
    result = step(env, call("note", text="a") + call("increment", step=1) + call("double"))
    assert env.instance.calls == ["increment(1)", "double()", "note(a)"]  # TRL: sync first, then async
    assert [m["name"] for m in result.messages] == ["note", "increment", "double"]
    assert env.instance.counter == 2  # (0 + 1) * 2: the order written


# --- rewards ----------------------------------------------------------------------------------------


def test_get_reward_alone_is_the_reward_when_none_is_configured() -> None:
    make = make_env(COUNTER)
    s = scorer(make=make)
    assert [(c.name, c.weight) for c in s.components] == [("CounterEnv", 1.0)]
    rollouts = [
        played(make(), counter_sample(3), [call("increment", step=3), "3"]),
        played(make(), counter_sample(3), [call("increment", step=1), "1"]),
    ]
    metrics = s.score(rollouts, {"s0": counter_sample(3)})
    assert [r.reward for r in rollouts] == [1.0, 0.0]
    assert metrics["rewards/CounterEnv/mean"] == 0.5  # logged as TRL logs an extra reward source
    assert all(r.env_state is None for r in rollouts)  # scored: the instances are let go


def test_get_reward_is_a_weight_one_component_beside_the_configured_ones_async_too() -> None:
    make = make_env(f"{MOD}:WordEnv")
    s = scorer("reward.components.len.fn=length", "reward.components.len.weight=0.5", make=make)
    assert [(c.name, c.weight) for c in s.components] == [("len", 0.5), ("WordEnv", 1.0)]
    sample = Sample("w", prompt="Play.")
    rollouts = [played(make(), sample, [call("guess", word="cat"), "done"])]
    rollouts += [played(make(), sample, [call("guess", word="dog"), call("guess", word="cow"), "gave up"])]
    s.score(rollouts, {"w": sample})
    assert [r.reward_parts["WordEnv"] for r in rollouts] == [1.0, -1.0]
    with pytest.raises(ValueError, match="rename it"):
        scorer("reward.components.WordEnv.fn=length", make=make)


def test_a_trl_reward_reads_environments_here_and_on_a_pickled_copy() -> None:
    make = make_env(COUNTER)
    s = scorer(f"reward.fn={MOD}:reached", make=make)
    samples = {"s0": counter_sample(3)}
    rollouts = [played(make(), counter_sample(3), [call("increment", step=n), "ok"]) for n in (3, 2)]
    copies = pickle.loads(pickle.dumps(rollouts))  # what a Ray reward worker gets
    s.score(rollouts, samples)
    assert [r.reward_parts for r in rollouts] == [
        {"reached": 1.0, "CounterEnv": 1.0},
        {"reached": 0.0, "CounterEnv": 0.0},
    ]
    scorer(f"reward.fn={MOD}:reached", make=make).score(copies, samples)
    assert [r.reward for r in copies] == [r.reward for r in rollouts] == [2.0, 0.0]
    # Without an environment run nothing is passed, as TRL passes `environments` only with a factory.
    plain = Rollout("s0", 0, [1, 2, 3], 2, [1], [-0.1], response_text="x")
    scorer(f"reward.fn={MOD}:reached").score([plain], samples)
    assert plain.metrics["reward/error"] == 1.0


# --- several environments ---------------------------------------------------------------------------


def test_env_trl_routes_each_row_by_its_environment_column() -> None:
    spec = {"environments": {"counter": COUNTER, "words": f"{MOD}:WordEnv"}}
    make = make_env("trl", spec)
    env = make()
    assert env.tools is None  # chosen by the row, in reset
    envs.CounterEnv.resets.clear()
    env.reset(Sample("a", prompt="Count.", meta={"environment": "counter", "target": 2}))
    assert [t["function"]["name"] for t in env.tools] == ["double", "increment", "note"]
    assert "environment" not in envs.CounterEnv.resets[-1]  # a control column, not passed to reset
    other = make()
    assert other.reset(Sample("b", prompt="Play.", meta={"environment": "words"}))[0]["content"] == (
        "Play.Guess the three-letter word."
    )
    assert [t["function"]["name"] for t in other.tools] == ["guess"]

    with pytest.raises(ValueError) as e:
        make().reset(Sample("c", prompt="?", meta={"environment": "chess"}))
    assert str(e.value) == (
        "sample 'c': environment 'chess' is not one of env.args.environments (counter, words)"
    )
    with pytest.raises(ValueError) as e:
        make().reset(Sample("d", prompt="?"))
    assert str(e.value) == (
        "sample 'd' has no 'environment' column to pick one of env.args.environments (counter, words)"
    )
    with pytest.raises(ValueError, match="give the recipe a dataset"):
        TrlEnv.make_samples(4, 0, "train", **spec)
    # One reward source per class, None for the episodes the other class played.
    sources = dict(trl_env_rewards(make))
    assert sorted(sources) == ["CounterEnv", "WordEnv"]
    counter = played(make(), Sample("a", prompt=".", meta={"environment": "counter", "target": 1}), ["x"])
    assert sources["CounterEnv"]([counter.env_state]) == [0.0]
    assert asyncio.run(sources["WordEnv"]([counter.env_state])) == [None]


def test_env_trl_names_a_bad_entry_in_one_line_at_setup() -> None:
    with pytest.raises(ValueError) as e:
        make_env("trl", {"environments": {"x": "no_such_module:Env"}})
    assert "\n" not in str(e.value) and "env.args.environments.x" in str(e.value)
    with pytest.raises(ValueError, match="is a Hone environment"):
        make_env("trl", {"environments": {"x": "hone.envs.games:GuessNumber"}})


def test_without_a_dataset_the_rows_are_trls_placeholders() -> None:
    (sample,) = TrlEnv.make_samples(1, 0, "train")
    assert sample.messages == [{"role": "user", "content": ""}] and sample.meta == {}


# --- an episode and a run ---------------------------------------------------------------------------


@pytest.mark.integration
def test_an_episode_runs_the_tools_and_its_rollout_carries_the_instance_until_scored(
    micro_model_dir: Path,
) -> None:
    from hone.rollout.multiturn import EpisodeLimits, run_episodes
    from hone.training.policy import Policy
    from hone.types import SamplingParams
    from tests.helpers import Scripted

    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    make = make_env(COUNTER)
    replies = [call("increment", step=2), call("double"), "4"]
    limits = EpisodeLimits(max_turns=3, max_tokens_per_turn=64, max_total_tokens=2048)
    (rollout,) = run_episodes(
        Scripted(tok, replies), tok, make, [counter_sample(4)], SamplingParams(n=1), limits
    )
    assert rollout.metrics["env/tool_calls"] == 2.0 and rollout.finish_reason == "stop"
    assert [m["content"] for m in rollout.messages if m["role"] == "tool"] == ["2", "4"]
    assert rollout.env_state.counter == 4  # the episode's instance, as it ended
    s = scorer(f"reward.fn={MOD}:reached", make=make)
    s.score([rollout], {"s0": counter_sample(4)})
    assert rollout.reward == 2.0 and rollout.env_state is None


@pytest.mark.integration
def test_a_training_run_with_a_trl_environment(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end through `hone train`: a TRL dataset (prompt and target, no answer column), the class by
    its dotted path, its get_reward beside a TRL reward reading `environments` and the row's column."""
    from hone.cli import main
    from hone.tracking import read_metrics
    from tests.helpers import tiny_run

    rows = [
        {"prompt": [{"role": "user", "content": f"Go to {i % 5 + 1}."}], "target": i % 5 + 1}
        for i in range(40)
    ]
    data = tmp_path / "counter.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = {
        "data.task": "null",
        "data.source": data,
        "env.name": COUNTER,
        "env.max_turns": 2,
        "env.max_tokens_per_turn": 8,
        "reward.fn": f"{MOD}:target_reward",
        "algorithm.skip_zero_variance_groups": "false",
    }
    assert main(["train", *tiny_run(tmp_path, micro_model_dir, **settings)]) == 0
    steps = [
        row for row in read_metrics(tmp_path / "r" / "metrics.jsonl") if "rewards/CounterEnv/mean" in row
    ]
    assert len(steps) == 2
    for row in steps:
        assert 1.0 <= row["rewards/target_reward/mean"] <= 5.0  # the targets the episodes were reset to
        assert row["rewards/CounterEnv/mean"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        assert row["reward/mean"] == pytest.approx(
            row["rewards/target_reward/mean"] + row["rewards/CounterEnv/mean"]
        )

"""`env.name: openenv_mcp`: an MCP-style OpenEnv server's tools as the policy's tools, against a calculator
built with openenv-core's own MCPEnvironment and FastMCP (tests/openenv_apps_for_tests.py), served in this
process by uvicorn: tools listed and rendered, episodes token for token, errors counted, set-up errors in
one line."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hone.envs import OpenEnvMCP, StepResult, make_env, openenv_tools, release_envs
from hone.envs.openenv_servers import _SERVERS
from hone.envs.openenv_tools import OpenEnvSessionError
from hone.models.tiny import CHAT_TEMPLATE
from hone.types import Sample
from tests.test_openenv import _serving

ROOT = Path(__file__).resolve().parents[1]

# The micro model's template, with a line naming the tools: what the policy is offered is in its prompt.
TOOLS_TEMPLATE = (
    "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}({{ t.function.parameters.properties "
    "| list | join(',') }}){% endfor %}{{ '\\n' }}{% endif %}" + CHAT_TEMPLATE
)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    from tests.openenv_apps_for_tests import calculator

    with _serving(calculator) as served:
        yield served


@pytest.fixture(autouse=True)
def _released() -> Iterator[None]:
    yield
    release_envs()  # each test learns the server's tools and capacity anew


def _call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _play(env: OpenEnvMCP, sample: Sample, moves: list[str]) -> tuple[list[dict], list[StepResult]]:
    async def play() -> tuple[list[dict], list[StepResult]]:
        try:
            initial = await env.reset(sample)
            return initial, [await env.step(move) for move in moves]
        finally:
            await env.close()

    return asyncio.run(play())


def test_tools_are_listed_once_kept_and_renamed(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    listings: list[str] = []
    real = openenv_tools._listing

    async def counted(*args: Any) -> list[dict[str, Any]]:
        listings.append(args[0])
        return await real(*args)

    monkeypatch.setattr(openenv_tools, "_listing", counted)
    env = make_env("openenv_mcp", {"url": url, "max_sessions": 2})()
    assert isinstance(env, OpenEnvMCP)
    assert [t["function"]["name"] for t in env.tools or []] == ["calc", "submit", "crash"]
    calc = (env.tools or [])[0]["function"]
    assert calc["description"] == "Add two integers."
    assert calc["parameters"]["required"] == ["a", "b"]
    assert calc["parameters"]["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    renamed = make_env(
        "openenv_mcp", {"url": url, "max_sessions": 2, "tools": {"calc": "add", "submit": "answer"}}
    )
    assert [t["function"]["name"] for t in renamed().tools or []] == ["add", "answer"]
    # The policy's name is mapped back to the server's: "add" is the server's calc.
    _, (added, answered) = _play(
        renamed(),
        Sample("s", prompt="go", meta={"a": 2, "b": 3}),
        [
            _call("add", a=2, b=3),
            _call("answer", answer=5),
        ],
    )
    assert added.messages == [{"role": "tool", "name": "add", "content": "5"}] and not added.done
    assert (answered.reward, answered.done) == (1.0, True)
    assert listings == [url]  # one session at set-up, not one per episode or per instance


def test_an_episode_is_played_token_for_token(micro_model_dir: Path, url: str) -> None:
    """The reset messages through the template (tools included) are the prompt; the server's answer to the
    calc call is the masked observation; submit's reward and done end the episode."""
    from hone.rollout.multiturn import EpisodeLimits, run_episodes
    from hone.training.policy import Policy
    from hone.types import SamplingParams
    from tests.helpers import Scripted

    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    tok.chat_template = TOOLS_TEMPLATE
    make = make_env("openenv_mcp", {"url": url})
    sample = Sample("s", prompt="What is 3+4?", meta={"a": 3, "b": 4})
    replies = [_call("calc", a=3, b=4), _call("submit", answer=7)]
    limits = EpisodeLimits(max_turns=4, max_tokens_per_turn=96, max_total_tokens=1024)
    (rollout,) = run_episodes(Scripted(tok, replies), tok, make, [sample], SamplingParams(n=1), limits)
    assert rollout.turn_rewards == [0.0, 1.0] and rollout.metrics["env/errors"] == 0.0
    assert rollout.metrics["env/tool_calls"] == 2.0 and rollout.metrics["env/tool_errors"] == 0.0
    prompt = "tools: calc(a,b) submit(answer) crash()\nuser: What is 3+4?\nassistant: "
    assert (
        tok.apply_chat_template(
            [{"role": "user", "content": "What is 3+4?"}],
            tools=make().tools,
            tokenize=False,
            add_generation_prompt=True,
        )
        == prompt
    )
    assert rollout.token_ids[: rollout.prompt_len] == tok.encode(prompt, add_special_tokens=False)
    first, last = ([*tok.encode(reply, add_special_tokens=False), tok.eos_token_id] for reply in replies)
    observation = tok.encode("\ntool: 7\nassistant: ", add_special_tokens=False)
    assert rollout.response_ids == first + observation + last
    assert rollout.loss_mask == [1] * len(first) + [0] * len(observation) + [1] * len(last)


def test_the_server_states_the_task_or_the_sample_does_and_a_final_answer_scores_nothing(url: str) -> None:
    env = make_env("openenv_mcp", {"url": url, "max_sessions": 2})
    said, (final,) = _play(env(), Sample("s", prompt="ignored", meta={"a": 1, "b": 2, "say": True}), ["3"])
    assert said == [{"role": "user", "content": "What is 1+2?"}]
    assert (final.messages, final.reward, final.done, final.info) == ([], 0.0, True, {})
    asked, _ = _play(env(), Sample("s", messages=[{"role": "system", "content": "sys"}], meta={"a": 1}), [])
    assert asked == [{"role": "system", "content": "sys"}]
    with pytest.raises(ValueError, match="sample 'empty' has no prompt or messages"):
        _play(env(), Sample("empty", prompt=None, meta={}), [])


def test_bad_calls_and_server_failures_are_counted_observations(url: str) -> None:
    env = make_env("openenv_mcp", {"url": url, "max_sessions": 2, "max_calls": 6})
    moves = [
        _call("nope"),
        _call("calc", a="x", b=1),
        _call("crash"),
        _call("calc", a=1, b=1) + _call("submit", answer=3) + _call("calc", a=2, b=2),
    ]
    _, (unknown, bad_args, crashed, last) = _play(
        env(), Sample("s", prompt="go", meta={"a": 1, "b": 1}), moves
    )
    assert unknown.messages[0]["content"] == "Error: unknown tool 'nope'; available: calc, submit, crash"
    assert bad_args.messages[0]["content"] == "Error: calc: argument a must be of type integer, got string"
    assert crashed.messages[0]["content"].startswith("Error: crash: ") and "the calculator broke" in str(
        crashed.messages
    )
    for result in (unknown, bad_args, crashed):
        assert (
            result.info == {"tool_calls": 1.0, "tool_errors": 1.0, "tool_timeouts": 0.0} and not result.done
        )
        assert result.reward == 0.0
    # A wrong submit ends the episode with the server's reward 0; the call written after it is not sent.
    assert [m["content"] for m in last.messages] == [
        "2",
        "wrong",
        "Error: calc: not run: the episode ended at an earlier call",
    ]
    assert (last.reward, last.done, last.info["tool_errors"]) == (0.0, True, 1.0)
    # The episode's budget of 6 calls: the second turn of 4 runs 2, the rest are answered, not sent.
    four = "".join(_call("calc", a=1, b=1) for _ in range(4))
    _, (_, spent) = _play(env(), Sample("s", prompt="go"), [four, four])
    assert [m["content"] for m in spent.messages] == [
        "2",
        "2",
        "Error: the episode's 6 tool calls are spent; 2 not run",
    ]
    assert spent.info == {"tool_calls": 4.0, "tool_errors": 2.0, "tool_timeouts": 0.0}


def test_a_session_that_stops_answering_ends_its_episode_only(micro_model_dir: Path, url: str) -> None:
    from hone.rollout.multiturn import EpisodeLimits, run_episodes
    from hone.training.policy import Policy
    from hone.types import SamplingParams
    from tests.helpers import Scripted

    env = make_env("openenv_mcp", {"url": url, "max_sessions": 4, "timeout_s": 1.0})
    with pytest.raises(OpenEnvSessionError, match=r"call_tool calc on .* failed: TimeoutError"):
        _play(env(), Sample("s", prompt="go", meta={"stall": 3.0}), [_call("calc", a=1, b=1)])
    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    samples = [
        Sample("ok", prompt="go", meta={"a": 1, "b": 1}),
        Sample("hung", prompt="go", meta={"stall": 3.0}),
    ]
    replies = [_call("calc", a=1, b=1), _call("submit", answer=2)]
    limits = EpisodeLimits(max_turns=4, max_tokens_per_turn=96, max_total_tokens=1024)
    ok, hung = run_episodes(Scripted(tok, replies), tok, env, samples, SamplingParams(n=1), limits)
    assert (ok.turn_rewards, ok.metrics["env/errors"]) == ([0.0, 1.0], 0.0)
    assert hung.metrics["env/errors"] == 1.0 and len(hung.turns) == 1


def test_set_up_errors_are_one_line(url: str) -> None:
    from hone.envs.openenv_games import app

    with (
        _serving(app) as plain,
        pytest.raises(
            ValueError,
            match=r"needs an MCP-style OpenEnv server .* the server at .* is not one: its "
            r"list_tools step failed: RuntimeError: Server error: Invalid message",
        ),
    ):
        make_env("openenv_mcp", {"url": plain})
    with pytest.raises(
        ValueError, match=r"env.args.tools names \['shout'\], which .* has \['calc', 'crash', 'sub"
    ):
        make_env("openenv_mcp", {"url": url, "max_sessions": 2, "tools": ["shout"]})
    with pytest.raises(
        ValueError, match=r"action field 'message'.*; an MCP-style server: env.name openenv_mcp"
    ):
        make_env("openenv", {"url": url})
    with pytest.raises(ValueError, match="exactly one of url"):
        make_env("openenv_mcp", {})
    with pytest.raises(ValueError, match="unreachable"):
        make_env("openenv_mcp", {"url": "http://127.0.0.1:9", "timeout_s": 2.0})


def test_the_docs_server_plays_through_the_adapter(tmp_path: Path) -> None:
    """docs/how-to/agents.md "MCP-style OpenEnv environments": its server, with its recipe's args."""
    page = (ROOT / "docs" / "how-to" / "agents.md").read_text()
    section = page[page.index("### MCP-style OpenEnv environments") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    recipe = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert code and recipe
    (tmp_path / "docs_mcp_server.py").write_text(code.group(1))
    spec = importlib.util.spec_from_file_location("docs_mcp_server", tmp_path / "docs_mcp_server.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = yaml.safe_load(recipe.group(1))["env"]["args"]
    assert args.pop("app") == "mycalc.server:app"
    with _serving(module.app) as served:
        env = make_env("openenv_mcp", {"url": served, **args})
        assert [t["function"]["name"] for t in env().tools or []] == ["add", "submit"]
        moves = [_call("add", a=2, b=5), _call("submit", answer=7)]
        _, (added, submitted) = _play(env(), Sample("s", prompt="2+5?", meta={"a": 2, "b": 5}), moves)
        _, (_, wrong) = _play(
            env(), Sample("s", prompt="2+5?", meta={"a": 2, "b": 5}), [moves[0], _call("submit", answer=8)]
        )
    assert added.messages == [{"role": "tool", "name": "add", "content": "7"}]
    assert (submitted.reward, submitted.done, wrong.reward, wrong.done) == (1.0, True, 0.0, True)


def test_a_lent_tool_game_gives_the_samples_the_question_and_the_final_verdict(url: str) -> None:
    from hone.envs import ToolArithmetic

    args = {"url": url, "max_sessions": 2, "samples": "tool_arithmetic"}
    env = make_env("openenv_mcp", args)
    (sample,) = OpenEnvMCP.make_samples(1, 0, "train", **args)
    assert sample == ToolArithmetic.make_samples(1, 0, "train")[0]
    a, b = sample.meta["a"], sample.meta["b"]
    initial, (added, right) = _play(env(), sample, [_call("calc", a=a, b=b), sample.answer or ""])
    assert initial == ToolArithmetic().reset(sample)  # the server states nothing: the game asks
    assert added.messages[0]["content"] == str(a + b)
    assert (right.reward, right.done, right.info) == (1.0, True, {"solved": 1.0})
    _, (wrong,) = _play(env(), sample, ["-1"])
    assert (wrong.reward, wrong.done) == (0.0, True)
    with pytest.raises(ValueError, match="env 'openenv_mcp' makes no samples of its own"):
        OpenEnvMCP.make_samples(1, 0, "train", url=url)


def test_a_server_hone_starts_plays_its_episodes_one_session_at_a_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`app`: openenv's start, health wait and session slots, reused: two episodes at once on a server of
    one session (max_sessions) take turns, and both are played; the server stops with the run."""
    args = {"app": "tests.openenv_apps_for_tests:calculator", "max_sessions": 1, "start_timeout_s": 60}
    with caplog.at_level(logging.INFO, logger="hone"):
        make = make_env("openenv_mcp", args)
    assert "serves 1 session(s) at once (env.args.max_sessions)" in caplog.text
    moves = [_call("calc", a=1, b=2), _call("submit", answer=3)]
    events: list[str] = []

    async def both() -> list[list[StepResult]]:
        async def one() -> list[StepResult]:
            env = make()
            try:
                await env.reset(Sample("s", prompt="go", meta={"a": 1, "b": 2}))
                events.append("open")
                return [await env.step(move) for move in moves]
            finally:
                await env.close()
                events.append("closed")

        return list(await asyncio.gather(one(), one()))

    played = asyncio.run(both())
    assert [[(r.reward, r.done) for r in results] for results in played] == [[(0.0, False), (1.0, True)]] * 2
    assert events == ["open", "closed", "open", "closed"]  # the second waited for the first's session
    (server,) = _SERVERS.values()
    release_envs()
    assert server.process.poll() is not None

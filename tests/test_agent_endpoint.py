"""Agent programs through the OpenAI-compatible endpoint: the plain `openai` client against the server,
token-exact trajectories and loss masks, `tools=` round trips, failures counted, bad specs, training,
and that the server is gone after a run (also an interrupted one)."""

from __future__ import annotations

import _thread
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import PreTrainedTokenizerBase

from hone.config import load_config
from hone.envs.games import ToolArithmetic
from hone.models.tiny import build_byte_tokenizer
from hone.rl.loop import RunInterrupted, SetupError, train
from hone.rollout import GenerationRequest, HFSampler
from hone.rollout.agent import AgentEpisodes, load_agent
from hone.rollout.endpoint import EndpointServer
from hone.rollout.multiturn import demonstration_tokens
from hone.training.policy import Policy
from hone.types import Rollout, Sample, SamplingParams
from tests.helpers import record_generations, tiny_overrides, wait_for

PARAMS = SamplingParams(n=1, temperature=1.0, max_new_tokens=96, seed=0)
NOTHING_COUNTED = {"env/tool_choice_violations": 0.0, "env/dropped_tool_calls": 0.0}


class ScriptedSampler:
    """A `Sampler` whose reply is a function of the prompt text; log-probs are distinct made-up values."""

    policy_version = 0

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, reply: Callable[[str], str], eos_id: int | None = None
    ) -> None:
        self.tokenizer, self.reply = tokenizer, reply
        self.eos_id = tokenizer.eos_token_id if eos_id is None else eos_id  # what each reply ends with
        self.eos_token_ids = frozenset({tokenizer.eos_token_id, self.eos_id})
        self.calls: list[tuple[list[GenerationRequest], SamplingParams, list[Rollout]]] = []

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[Rollout]:
        outs = []
        for r in requests:
            ids = self.tokenizer.encode(
                self.reply(self.tokenizer.decode(r.prompt_ids)), add_special_tokens=False
            )
            ids = [*ids, self.eos_id]
            logprobs = [-(len(self.calls) + 1) / 7 - k / 100 for k in range(len(ids))]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            outs.append(
                Rollout(
                    r.sample_id,
                    r.group_id,
                    r.prompt_ids + ids,
                    len(r.prompt_ids),
                    [1] * len(ids),
                    logprobs,
                    text,
                    policy_version=self.policy_version,
                )
            )
        self.calls.append((requests, params, outs))
        return outs

    def load_weights(self, state_dict: object, version: int) -> None:
        self.policy_version = version

    def close(self) -> None: ...


def calculator_reply(prompt: str) -> str:
    """Calls the calculator on the question, then answers with the tool's result."""
    if result := re.search(r"tool: (\S+)\nassistant: $", prompt):
        return result.group(1)
    expression = re.search(r"What is (\d+[*+]\d+)\?", prompt).group(1)  # type: ignore[union-attr]
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"Let me compute. <tool_call>{json.dumps(call)}</tool_call>"


@pytest.fixture
def tokenizer() -> PreTrainedTokenizerBase:
    return build_byte_tokenizer()


def serve(sampler: object, tokenizer: PreTrainedTokenizerBase) -> EndpointServer:
    return EndpointServer(sampler, tokenizer)  # type: ignore[arg-type]


def endpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hone-endpoint")]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_tool_call_output_comes_back_as_openai_tool_calls(tokenizer: PreTrainedTokenizerBase) -> None:
    sampler = ScriptedSampler(tokenizer, calculator_reply)
    with serve(sampler, tokenizer) as server:
        episode = server.open_episode(PARAMS, max_completions=4)

        async def ask() -> openai.types.chat.ChatCompletion:
            async with openai.AsyncOpenAI(base_url=server.base_url(episode), api_key="x", max_retries=0) as c:
                models = await c.models.list()
                assert [m.id for m in models.data] == ["hone-policy"]
                return await c.chat.completions.create(
                    model="any",
                    messages=[{"role": "user", "content": "What is 12*3?"}],
                    tools=[{"type": "function", "function": {"name": "calculator", "parameters": {}}}],
                )

        choice = asyncio.run(ask()).choices[0]
        server.close_episode(episode)
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me compute."
    [call] = choice.message.tool_calls or []
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {
        "expression": "12*3"
    }


def calculator_agent(server: EndpointServer, concurrency: int) -> AgentEpisodes:
    """The packaged calculator agent (plain `openai` client code) against `server`."""
    return AgentEpisodes(
        load_agent("hone.envs.calculator_agent:run"),
        server,
        concurrency=concurrency,
        timeout_s=30,
        max_completions=4,
    )


def test_calculator_agent_trajectory_is_exactly_what_the_sampler_produced(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    sampler = ScriptedSampler(tokenizer, calculator_reply)
    samples = ToolArithmetic.make_samples(6, 0, "train")  # distinct problems: each prompt is one episode's
    with serve(sampler, tokenizer) as server:
        agent = calculator_agent(server, concurrency=8)
        played = agent.play(samples, SamplingParams(n=1, temperature=1.0, max_new_tokens=96, seed=0))
    assert played.metrics == {"env/errors": 0.0, "env/timeouts": 0.0} | NOTHING_COUNTED
    assert [r.group_id for r in played.rollouts] == [0, 1, 2, 3, 4, 5]
    served = [(req, out) for reqs, _, outs in sampler.calls for req, out in zip(reqs, outs, strict=True)]
    assert len(served) == 12  # a tool call and an answer per episode
    for r in played.rollouts:
        assert r.turn_rewards == [1.0] and len(r.turns) == 2
        # Find this episode's two completions: the second one's prompt is the rollout's context up to it.
        (_, second) = r.turns
        [(req2, out2)] = [
            (q, o) for q, o in served if q.prompt_ids == r.token_ids[: r.prompt_len + second[0]]
        ]
        [(req1, out1)] = [(q, o) for q, o in served if q.prompt_ids == r.token_ids[: r.prompt_len]]
        observation = r.token_ids[req1.prompt_ids.__len__() + out1.response_len : len(req2.prompt_ids)]
        assert tokenizer.decode(observation) == f"\ntool: {r.response_text}\nassistant: "
        assert r.token_ids == req2.prompt_ids + out2.response_ids
        assert r.response_ids == out1.response_ids + observation + out2.response_ids
        assert r.sampler_logprobs == out1.sampler_logprobs + [0.0] * len(observation) + out2.sampler_logprobs
        assert r.loss_mask == [1] * out1.response_len + [0] * len(observation) + [1] * out2.response_len


def test_a_rewritten_history_starts_a_new_sequence_sharing_the_reward(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    async def forgetful(client: openai.AsyncOpenAI, sample: Sample) -> list[float]:
        for question in ("first", "second"):  # the second request does not extend the first's context
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
        return [0.25, 0.5]

    sampler = ScriptedSampler(tokenizer, lambda prompt: "ok")
    with serve(sampler, tokenizer) as server:
        agent = AgentEpisodes(_spec(forgetful), server, concurrency=4, timeout_s=30, max_completions=4)
        training = agent.play([Sample("s", prompt="p")], PARAMS).rollouts
        evaluated = agent.play([Sample("s", prompt="p")], PARAMS, last_segment_only=True).rollouts
    assert [tokenizer.decode(r.token_ids[: r.prompt_len]) for r in training] == [
        "user: first\nassistant: ",
        "user: second\nassistant: ",
    ]
    assert all(r.turn_rewards == [0.25, 0.5] and r.metrics["episode/segments"] == 2 for r in training)
    assert [tokenizer.decode(r.token_ids[: r.prompt_len]) for r in evaluated] == ["user: second\nassistant: "]


def test_requests_from_many_episodes_are_batched(tokenizer: PreTrainedTokenizerBase) -> None:
    sampler = ScriptedSampler(tokenizer, calculator_reply)
    samples = ToolArithmetic.make_samples(8, 0, "train")
    with serve(sampler, tokenizer) as server:
        agent = calculator_agent(server, concurrency=64)
        played = agent.play(samples, SamplingParams(n=4, temperature=1.0, max_new_tokens=96, seed=0))
    assert len(played.rollouts) == 32
    sizes = [len(reqs) for reqs, _, _ in sampler.calls]
    assert sum(sizes) == 64 and max(sizes) > 1 and len(sizes) < 64


def test_refused_requests_get_one_clear_openai_error(tokenizer: PreTrainedTokenizerBase) -> None:
    with serve(ScriptedSampler(tokenizer, lambda p: "x"), tokenizer) as server:
        episode = server.open_episode(PARAMS, max_completions=1)
        messages = [{"role": "user", "content": "hi"}]

        async def errors() -> list[str]:
            found = []
            url = server.base_url(episode)
            for base_url, extra in [
                (url, {"stream": True}),
                (url, {"n": 2}),
                (url.replace(episode, "nope"), {}),
                (url.replace(f"/e/{episode}", ""), {}),
                (url, {}),  # the one completion the episode may have: served
                (url, {}),  # and the next is refused
            ]:
                async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as c:
                    try:
                        await c.chat.completions.create(model="m", messages=messages, **extra)
                    except openai.APIStatusError as e:
                        found.append(f"{e.status_code} {e.body['message']}")  # type: ignore[index]
            return found

        found = asyncio.run(errors())
    assert [line.split(" ", 1)[0] for line in found] == ["400", "400", "404", "404", "400"]
    assert "stream" in found[0] and "n must be 1" in found[1] and "unknown or finished episode" in found[2]
    assert "base_url" in found[3] and "rollout.agent_max_completions" in found[4]


def test_what_the_endpoint_cannot_honour_is_refused_by_name_and_tool_choice_none_offers_no_tools(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    seen_prompts: list[list[int]] = []

    def reply(prompt_ids: list[int]) -> str:
        seen_prompts.append(prompt_ids)
        return "x"

    with serve(ScriptedSampler(tokenizer, reply), tokenizer) as server:
        episode = server.open_episode(PARAMS, max_completions=4)
        messages = [{"role": "user", "content": "hi"}]
        tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]

        async def calls() -> tuple[list[str], Any, Any]:
            found = []
            async with openai.AsyncOpenAI(base_url=server.base_url(episode), api_key="x", max_retries=0) as c:
                image = [{"type": "image_url", "image_url": {"url": "data:,"}}]
                for extra in [
                    {"response_format": {"type": "json_object"}},
                    {"tool_choice": {"type": "function", "function": {"name": "mul"}}, "tools": tools},
                    {"messages": [{"role": "user", "content": image}]},
                    {"tool_choice": "required"},  # and no tools
                    {"tool_choice": "any", "tools": tools},
                    {"parallel_tool_calls": "no"},
                ]:
                    try:
                        await c.chat.completions.create(**{"model": "m", "messages": messages, **extra})
                    except openai.APIStatusError as e:
                        found.append(f"{e.status_code} {e.body['message']}")  # type: ignore[index]
                plain = await c.chat.completions.create(model="m", messages=messages, logprobs=True)
                no_tools = await c.chat.completions.create(
                    model="m",
                    messages=messages,
                    tools=tools,
                    tool_choice="none",  # type: ignore[arg-type]
                )
            return found, plain, no_tools

        found, plain, no_tools = asyncio.run(calls())
    assert [line.split(" ", 1)[0] for line in found] == ["400"] * 6
    assert "response_format" in found[0] and "image_url" in found[2]
    assert "tool_choice names the function 'mul', not in tools (offered: add)" in found[1]
    assert "tool_choice required needs tools" in found[3] and 'tool_choice "any" is not' in found[4]
    assert "parallel_tool_calls must be true or false" in found[5]
    tokens = plain.choices[0].logprobs.content  # every sampled token, with the sampler's log-prob
    assert len(tokens) == plain.usage.completion_tokens and all(t.logprob <= 0.0 for t in tokens)
    assert "".join(t.token for t in tokens).startswith("x")
    # tool_choice none: the prompt is rendered as without tools (the same ids as the plain request's)
    assert no_tools.choices[0].message.content == "x" and seen_prompts[-1] == seen_prompts[-2]


def _call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("add", "mul")
]


def test_a_reply_without_the_call_tool_choice_demands_is_refused_counted_and_still_recorded(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """tool_choice required or named: the endpoint cannot constrain sampling, so a reply that lacks the
    call is refused with a 422 naming the rule, counted, and kept in the trajectory as the policy wrote it."""
    replies = {
        "plain": "I know it: 5",
        "add": _call("add", a=2, b=3),
        "mul": _call("mul", a=2, b=3),
        "both": _call("add", a=1, b=1) + _call("mul", a=2, b=3),
    }

    def reply(prompt: str) -> str:
        return replies[re.findall(r"user: (\w+)", prompt)[-1]]

    outcomes: list[str] = []

    async def agent(client: openai.AsyncOpenAI, sample: Sample) -> float:
        for ask, choice in [
            ("add", "required"),
            ("plain", "required"),
            ("add", {"type": "function", "function": {"name": "add"}}),
            ("mul", {"type": "function", "function": {"name": "add"}}),
            ("both", {"type": "function", "function": {"name": "add"}}),
            ("plain", {"type": "function", "function": {"name": "add"}}),
            ("add", "none"),  # no tools offered: a call written anyway comes back as text
        ]:
            try:
                out = await client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": ask}],
                    tools=TOOLS,  # type: ignore[arg-type]
                    tool_choice=choice,  # type: ignore[arg-type]
                )
                message = out.choices[0].message
                names = " ".join(c.function.name for c in message.tool_calls or [])
                outcomes.append(names or f"text {message.content}")
            except openai.UnprocessableEntityError as e:  # the agent goes on: its reward is its own
                outcomes.append(f"422 {e.body['message']}")  # type: ignore[index]
        return 0.5

    sampler = ScriptedSampler(tokenizer, reply)
    with serve(sampler, tokenizer) as server:
        episodes = AgentEpisodes(_spec(agent), server, concurrency=1, timeout_s=30, max_completions=8)
        played = episodes.play([Sample("s", prompt="p")], PARAMS)
    assert outcomes == [
        "add",
        "422 tool_choice is required but the model answered without a tool call",
        "add",
        "422 tool_choice names the function 'add' but the model called mul",
        "422 tool_choice names the function 'add' but the model called mul",
        "422 tool_choice names the function 'add' but the model answered without a tool call",
        f"text {replies['add']}",
    ]
    assert played.metrics["env/tool_choice_violations"] == 4.0 and played.metrics["env/errors"] == 0.0
    # Every request rewrote the history (a new question each time): seven sequences, each the sampler's
    # own tokens for its prompt, refused replies included, all trained on with the agent's reward.
    served = [o for _, _, outs in sampler.calls for o in outs]
    assert len(played.rollouts) == 7
    for r, out in zip(played.rollouts, served, strict=True):
        assert r.token_ids == out.token_ids and r.loss_mask == [1] * out.response_len
        assert r.sampler_logprobs == out.sampler_logprobs and r.turn_rewards == [0.5]


def test_parallel_tool_calls_false_returns_the_first_call_and_the_episode_stays_one_exact_sequence(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    def reply(prompt: str) -> str:
        return "The sum is 7." if "tool: " in prompt else _call("add", a=3, b=4) + _call("mul", a=3, b=4)

    returned: list[Any] = []

    async def agent(client: openai.AsyncOpenAI, sample: Sample) -> float:
        messages: list[Any] = [{"role": "user", "content": "3+4?"}]
        first = (
            await client.chat.completions.create(
                model="m",
                messages=messages,
                tools=TOOLS,
                parallel_tool_calls=False,  # type: ignore[arg-type]
            )
        ).choices[0]
        returned.append(first)
        [call] = first.message.tool_calls or []
        messages += [
            first.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "7"},
        ]
        second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        returned.append(second.choices[0])
        return 1.0

    sampler = ScriptedSampler(tokenizer, reply)
    with serve(sampler, tokenizer) as server:
        episodes = AgentEpisodes(_spec(agent), server, concurrency=1, timeout_s=30, max_completions=4)
        played = episodes.play([Sample("s", prompt="p")], PARAMS)
    first, second = returned
    assert first.finish_reason == "tool_calls" and first.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in first.message.tool_calls] == [
        ("add", {"a": 3, "b": 4})
    ]
    assert second.message.content == "The sum is 7."
    assert played.metrics["env/dropped_tool_calls"] == 1.0
    # One sequence: the reply the agent sent back (one call) rendered as the model wrote it (two calls).
    [r] = played.rollouts
    [(_, _, [out1]), (_, _, [out2])] = sampler.calls
    assert r.metrics["episode/segments"] == 1.0 and len(r.turns) == 2
    assert r.token_ids[: len(out1.token_ids)] == out1.token_ids and r.token_ids[-out2.response_len :] == (
        out2.response_ids
    )
    assert r.token_ids == out2.token_ids
    assert tokenizer.decode(out1.response_ids, skip_special_tokens=True).count("<tool_call>") == 2


def test_a_special_token_sampled_mid_reply_does_not_split_the_episode(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """The served text drops special tokens (a `<pad>` sampled mid-reply): the agent's copy of the reply
    is still rendered as the tokens the model wrote, so the next request extends the same sequence."""
    pad = tokenizer.pad_token_id

    def reply(prompt: str) -> str:
        return "done" if "again" in prompt else "ab<pad>cd"

    contents: list[str | None] = []

    async def agent(client: openai.AsyncOpenAI, sample: Sample) -> float:
        messages: list[Any] = [{"role": "user", "content": "go"}]
        for _ in range(2):
            out = (await client.chat.completions.create(model="m", messages=messages)).choices[0]
            contents.append(out.message.content)
            messages += [out.message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        return 1.0

    sampler = ScriptedSampler(tokenizer, reply)
    with serve(sampler, tokenizer) as server:
        episodes = AgentEpisodes(_spec(agent), server, concurrency=1, timeout_s=30, max_completions=4)
        [r] = episodes.play([Sample("s", prompt="p")], PARAMS).rollouts
    assert contents == ["abcd", "done"]
    [(_, _, [out1]), (_, _, [out2])] = sampler.calls
    assert pad in out1.response_ids and r.metrics["episode/segments"] == 1.0
    assert r.token_ids == out2.token_ids and r.token_ids[: len(out1.token_ids)] == out1.token_ids
    assert tokenizer.decode(r.token_ids) == (
        "user: go\nassistant: ab<pad>cd<eos>\nuser: again\nassistant: done<eos>"
    )


async def _answers(client: openai.AsyncOpenAI, sample: Sample) -> float:
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": sample.prompt}])
    if sample.prompt == "boom":
        raise ConnectionError("the agent's own tool is down")
    if sample.prompt == "slow":
        await asyncio.sleep(30)
    return 1.0


async def _by_url(base_url: str, sample: Sample) -> float:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x") as client:
        return await _answers(client, sample)


def _spec(fn: Callable[..., object]):  # type: ignore[no-untyped-def]
    from hone.rollout.agent import AgentSpec

    return AgentSpec(fn, wants_base_url=fn.__code__.co_varnames[0] == "base_url")  # type: ignore[arg-type, attr-defined]


@pytest.mark.parametrize("agent", [_answers, _by_url])
def test_failing_and_slow_episodes_are_counted_and_dropped(
    tokenizer: PreTrainedTokenizerBase, agent: object
) -> None:
    samples = [Sample(p, prompt=p) for p in ("ok", "boom", "slow", "ok2")]
    with serve(ScriptedSampler(tokenizer, lambda p: "1"), tokenizer) as server:
        episodes = AgentEpisodes(_spec(agent), server, concurrency=8, timeout_s=1.0, max_completions=2)  # type: ignore[arg-type]
        played = episodes.play(samples, PARAMS)
        assert [r.sample_id for r in played.rollouts] == ["ok", "ok2"]
        assert played.metrics == {"env/errors": 2.0, "env/timeouts": 1.0} | NOTHING_COUNTED
        with pytest.raises(
            RuntimeError, match="every one of 1 agent episodes failed; first: ConnectionError"
        ):
            episodes.play([Sample("boom", prompt="boom")], PARAMS)


def sync_agent(client: object, sample: Sample) -> float:
    return 0.0


async def three_args(client: object, sample: Sample, extra: int) -> float:
    return 0.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "no_such_module:run",
            r"rollout.agent 'no_such_module:run': cannot import 'run' from 'no_such_module': "
            "ModuleNotFoundError",
        ),
        ("tests.test_agent_endpoint", r"expected 'pkg.module:function'"),
        ("tests.test_agent_endpoint:sync_agent", r"is not an async function; define it as `async def"),
        ("tests.test_agent_endpoint:three_args", r"must take two arguments .*: client, sample, extra$"),
    ],
)
def test_a_bad_agent_spec_is_one_line_at_setup(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        load_agent(spec)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"rollout.agent": "tests.test_agent_endpoint:three_args"},
            r"^rollout.agent '.*' must take two arguments",
        ),
        (
            {"rollout.agent_tool_parser": "nope"},
            r"^rollout.agent_tool_parser: unknown tool-call parser 'nope'",
        ),
    ],
)
def test_a_bad_agent_setting_stops_the_run_at_setup_with_its_line(
    tmp_path: Path, micro_model_dir: Path, overrides: dict[str, str], message: str
) -> None:
    cfg = load_config(None, agent_overrides(tmp_path, micro_model_dir, "bad", **overrides))
    with pytest.raises(SetupError, match=message) as raised:
        train(cfg)
    assert "\n" not in str(raised.value) and endpoint_threads() == []


def test_the_endpoint_serves_the_weights_last_published(tokenizer: PreTrainedTokenizerBase) -> None:
    sampler = ScriptedSampler(tokenizer, lambda p: "1")
    with serve(sampler, tokenizer) as server:
        agent = AgentEpisodes(_spec(_answers), server, concurrency=2, timeout_s=30, max_completions=2)
        before = agent.play([Sample("ok", prompt="ok")], PARAMS).rollouts
        sampler.load_weights({}, version=3)  # what a publish does to the run's sampler
        after = agent.play([Sample("ok", prompt="ok")], PARAMS).rollouts
    assert [r.policy_version for r in before + after] == [0, 3]


def test_real_sampler_tokens_and_logprobs_land_in_the_trajectory(micro_model_dir: Path) -> None:
    policy = Policy.from_pretrained(str(micro_model_dir))
    sampler = HFSampler(policy.model, policy.tokenizer)
    seen = record_generations(sampler)

    async def two_turns(client: openai.AsyncOpenAI, sample: Sample) -> float:
        messages: list[dict[str, object]] = [{"role": "user", "content": "2+2?"}]
        for _ in range(2):
            reply = (
                await client.chat.completions.create(model="m", messages=messages, max_tokens=6)
            ).choices[0]
            messages += [reply.message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        return 1.0

    with serve(sampler, policy.tokenizer) as server:
        agent = AgentEpisodes(_spec(two_turns), server, concurrency=4, timeout_s=60, max_completions=2)
        [r] = agent.play(
            [Sample("s", prompt="p")], SamplingParams(n=1, temperature=1.0, max_new_tokens=16, seed=3)
        ).rollouts
    (first_prompt, first), (second_prompt, second) = seen
    assert first.response_len <= 6 and second.response_len <= 6  # the request's max_tokens lowered the cap
    assert second_prompt[: len(first_prompt) + first.response_len] == first_prompt + first.response_ids
    assert r.token_ids == second_prompt + second.response_ids and r.prompt_len == len(first_prompt)
    n_obs = len(second_prompt) - len(first_prompt) - first.response_len
    assert r.loss_mask == [1] * first.response_len + [0] * n_obs + [1] * second.response_len
    assert r.sampler_logprobs == first.sampler_logprobs + [0.0] * n_obs + second.sampler_logprobs


def agent_overrides(run_dir: Path, model_dir: Path, name: str, **extra: object) -> list[str]:
    return tiny_overrides(
        run_dir,
        model_dir,
        name,
        **{
            "data.task": "null",
            "env.name": "tool_arithmetic",
            "rollout.agent": "hone.envs.calculator_agent:run",
            "rollout.max_new_tokens": 8,
            "reward.fn": "env",
            "data.eval_size": 4,
            "data.prompts_per_step": 2,
            "rollout.n": 2,
            "run.eval_every": 0,
            "run.save_every": 0,
        }
        | extra,
    )


@pytest.fixture
def server_ports(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ports of the endpoint servers started while the test runs."""
    ports: list[int] = []
    original = EndpointServer.__init__

    def remember(self: EndpointServer, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        ports.append(self.port)

    monkeypatch.setattr(EndpointServer, "__init__", remember)
    return ports


def test_training_through_the_endpoint_runs_and_leaves_no_server(
    tmp_path: Path, micro_model_dir: Path, server_ports: list[int]
) -> None:
    cfg = load_config(None, agent_overrides(tmp_path, micro_model_dir, "agent", **{"run.steps": 2}))
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "loss/policy" in row]
    assert [row["step"] for row in trained] == [1, 2]
    assert all(row["env/errors"] == 0.0 and row["episode/turns"] >= 1 for row in trained)
    assert rows[0]["eval/env/errors"] == 0.0 and "eval/accuracy" in rows[-1]
    assert len(server_ports) == 1 and not port_open(server_ports[0]) and endpoint_threads() == []


async def interrupting(client: openai.AsyncOpenAI, sample: Sample) -> float:
    """Ctrl-C (SIGTERM is turned into the same by `hone.cli`) while episodes are under way."""
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    _thread.interrupt_main()
    await asyncio.sleep(30)
    return 0.0


def test_an_interrupted_run_stops_the_server(
    tmp_path: Path, micro_model_dir: Path, server_ports: list[int]
) -> None:
    # Ctrl-C as a terminal delivers it: Python's own handler, whatever an earlier test in this worker left.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_run(tmp_path, micro_model_dir, server_ports)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_run(tmp_path: Path, micro_model_dir: Path, server_ports: list[int]) -> None:
    # A bounded episode: were the interrupt lost, the run would fail in seconds, not hang.
    overrides = {"rollout.agent": "tests.test_agent_endpoint:interrupting", "rollout.agent_timeout_s": 10}
    cfg = load_config(None, agent_overrides(tmp_path, micro_model_dir, "stop", **overrides))
    with pytest.raises((RunInterrupted, KeyboardInterrupt)):
        train(cfg)
    assert len(server_ports) == 1 and not port_open(server_ports[0]) and endpoint_threads() == []


# A ChatML template with Hermes tool calls, in the manner of Qwen2.5's (written for this test): tools in a
# system message, an assistant's `tool_calls` re-rendered as JSON blocks, tool results inside a user turn.
CHATML_TOOLS = (
    "{%- if tools %}<|im_start|>system{{ '\\n' }}Tools:{% for t in tools %}{{ '\\n' }}{{ t | tojson }}"
    "{% endfor %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user{{ '\\n' }}<tool_response>{{ '\\n' }}{{ m.content }}"
    "{{ '\\n' }}</tool_response><|im_end|>{{ '\\n' }}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant{{ '\\n' }}{{ m.content }}"
    "{%- for c in m.tool_calls %}<tool_call>{{ '\\n' }}"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}'
    "{{ '\\n' }}</tool_call>{% endfor %}<|im_end|>{{ '\\n' }}"
    "{%- else %}<|im_start|>{{ m.role }}{{ '\\n' }}{{ m.content }}<|im_end|>{{ '\\n' }}{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
)


def chatml_reply(prompt: str) -> str:
    if result := re.search(
        r"<tool_response>\n(\S+)\n</tool_response><\|im_end\|>\n<\|im_start\|>assistant\n$", prompt
    ):
        return f"The answer is {result.group(1)}."
    return calculator_reply(prompt)


def test_a_template_that_rerenders_tool_calls_still_gives_one_exact_sequence() -> None:
    tokenizer = build_byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHATML_TOOLS
    sampler = ScriptedSampler(tokenizer, chatml_reply)
    samples = ToolArithmetic.make_samples(2, 0, "train")
    with serve(sampler, tokenizer) as server:
        agent = calculator_agent(server, concurrency=4)
        rollouts = agent.play(samples, PARAMS).rollouts
    served = {
        tuple(q.prompt_ids): o for reqs, _, outs in sampler.calls for q, o in zip(reqs, outs, strict=True)
    }
    assert len(rollouts) == 2
    for r in rollouts:
        assert r.turn_rewards == [1.0] and r.metrics["episode/segments"] == 1 and len(r.turns) == 2
        sampled = [r.response_ids[a:b] for a, b in r.turns]
        # Each turn's tokens are the sampler's output for the context before it, and only they are trained.
        for (a, _), tokens in zip(r.turns, sampled, strict=True):
            assert served[tuple(r.token_ids[: r.prompt_len + a])].response_ids == tokens
        assert sum(r.loss_mask) == sum(map(len, sampled))
        # The template's own rendering of the parsed call is not what the model wrote: re-rendering the
        # conversation the agent sent would have trained on tokens the model never sampled.
        call_text = tokenizer.decode(sampled[0], skip_special_tokens=True)
        call = json.loads(call_text.split("<tool_call>")[1].split("</tool_call>")[0])
        function = {"name": call["name"], "arguments": json.dumps(call["arguments"])}
        message = {"role": "assistant", "content": "Let me compute.", "tool_calls": [{"function": function}]}
        assert call_text not in tokenizer.apply_chat_template([message], tokenize=False)
        assert tokenizer.decode(r.token_ids).count("<tool_response>") == 1


def test_a_reply_ending_on_another_eos_than_the_templates_still_extends_its_sequence() -> None:
    """Qwen's generation config stops on <|endoftext|> as well as <|im_end|>, the token its template closes
    a turn with: the sampled <|endoftext|> stands for the template's <|im_end|>, no new sequence."""
    tokenizer = build_byte_tokenizer()
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]}
    )
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHATML_TOOLS
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    sampler = ScriptedSampler(tokenizer, chatml_reply, eos_id=endoftext)
    samples = ToolArithmetic.make_samples(2, 0, "train")
    with serve(sampler, tokenizer) as server:
        rollouts = calculator_agent(server, concurrency=4).play(samples, PARAMS).rollouts
    served = {
        tuple(q.prompt_ids): o for reqs, _, outs in sampler.calls for q, o in zip(reqs, outs, strict=True)
    }
    assert len(rollouts) == 2
    for r in rollouts:
        assert r.turn_rewards == [1.0] and r.metrics["episode/segments"] == 1 and len(r.turns) == 2
        for a, b in r.turns:
            assert served[tuple(r.token_ids[: r.prompt_len + a])].response_ids == r.response_ids[a:b]
        (_, end1), (start2, _) = r.turns
        # The sampled eos closes the turn; the template's own <|im_end|> is not added after it.
        assert r.response_ids[end1 - 1] == endoftext
        assert tokenizer.decode(r.response_ids[end1:start2]).startswith("\n<|im_start|>user\n<tool_response>")


async def waiting(client: openai.AsyncOpenAI, sample: Sample) -> float:
    """Tells the test its endpoint's URL, then waits: the run is mid-episode when it is stopped."""
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    # Written whole, then renamed into place: the test reads the file as soon as it exists, and the run's
    # `rollout.n` episodes all write it.
    ready = Path(os.environ["HONE_TEST_AGENT_READY"])
    partial = ready.with_name(f"{ready.name}.{uuid.uuid4().hex}")
    partial.write_text(str(client.base_url))
    os.replace(partial, ready)
    await asyncio.sleep(60)
    return 0.0


def test_sigterm_mid_episode_ends_the_run_and_its_server(tmp_path: Path, micro_model_dir: Path) -> None:
    ready = tmp_path / "ready"
    args = agent_overrides(
        tmp_path, micro_model_dir, "r", **{"rollout.agent": "tests.test_agent_endpoint:waiting"}
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "hone.cli", "train", *args],
        env={
            **os.environ,
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "HONE_TEST_AGENT_READY": str(ready),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, 120)
        assert ready.exists() and proc.poll() is None, "no agent episode started"
        port = int(ready.read_text().split(":")[2].split("/")[0])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].startswith("hone: interrupted") and "Traceback" not in err, err
    assert not port_open(port)


def test_a_port_in_use_is_one_line(tokenizer: PreTrainedTokenizerBase) -> None:
    sampler = ScriptedSampler(tokenizer, lambda p: "x")
    with serve(sampler, tokenizer) as server:
        taken = rf"^agent endpoint: cannot listen on 127.0.0.1:{server.port} \(rollout.agent_port\): "
        with pytest.raises(OSError, match=taken):
            EndpointServer(sampler, tokenizer, port=server.port)  # type: ignore[arg-type]
    assert endpoint_threads() == []


@pytest.mark.parametrize("template", ["tiny", "chatml"])
def test_the_agent_plays_the_warm_start_demonstrations_token_for_token(template: str) -> None:
    """The recipe warm-starts on `tool_arithmetic`'s demonstrations: a policy that writes them must find
    the agent's episodes laid out as the very tokens and mask SFT trained on."""
    tokenizer = build_byte_tokenizer()
    if template == "chatml":
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tokenizer.eos_token = "<|im_end|>"
        tokenizer.chat_template = CHATML_TOOLS
    env = ToolArithmetic()
    samples = ToolArithmetic.make_samples(3, 0, "train")
    scripts = {
        s.meta["a"]: [m["content"] for m in env.demonstration(s) if m["role"] == "assistant"] for s in samples
    }

    def demonstrated(prompt: str) -> str:  # the demonstration's next assistant turn
        a = int(re.search(r"What is (\d+)", prompt).group(1))  # type: ignore[union-attr]
        return scripts[a][prompt.count("<tool_call>")]

    with serve(ScriptedSampler(tokenizer, demonstrated), tokenizer) as server:
        agent = calculator_agent(server, concurrency=4)
        rollouts = agent.play(samples, PARAMS).rollouts
    assert len(rollouts) == 3
    for sample, r in zip(samples, rollouts, strict=True):
        ids, mask = demonstration_tokens(tokenizer, env.demonstration(sample), env.tools)
        assert r.turn_rewards == [1.0]
        assert r.token_ids == ids and [0] * r.prompt_len + r.loss_mask == mask

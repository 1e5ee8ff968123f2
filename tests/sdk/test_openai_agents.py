"""A held-out check of the endpoint against third-party agent code: an OpenAI Agents SDK program (an
`Agent` with a `function_tool`, run by `Runner`) trained through Hone unchanged, its episodes token-exact
and scored. The SDK needs openai>=3, which the dev venv's verifiers rule out: this runs from its own venv
(`make test-agents-sdk`, the `openai-agents` extra) and is skipped elsewhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra: make test-agents-sdk")

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from hone.config import load_config
from hone.envs.games import ToolArithmetic
from hone.envs.tools import calculator as hone_calculator
from hone.models.tiny import build_byte_tokenizer
from hone.rl.loop import train
from hone.rollout import HFSampler, endpoint
from hone.rollout.agent import AgentEpisodes, load_agent
from hone.rollout.chat_request import ChatRequest, read_request
from hone.rollout.endpoint import EndpointServer
from hone.training.policy import Policy
from hone.types import Sample, SamplingParams
from hone.verifiers.math import math_reward
from tests.helpers import record_generations, tiny_overrides
from tests.test_agent_endpoint import ScriptedSampler, calculator_reply

set_tracing_disabled(True)  # the SDK would post traces to OpenAI: no network here, nor wanted


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12*3."""
    return hone_calculator(expression)


async def run(client: Any, sample: Sample, settings: ModelSettings | None = None) -> float:
    """The agent program under test, as a user writes it: plain Agents SDK code given Hone's client."""
    agent = Agent(
        name="calculator",
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        tools=[calculator],
        model_settings=settings or ModelSettings(),
    )
    question = f"What is {sample.meta['a']}{sample.meta['op']}{sample.meta['b']}? Use the calculator."
    result = await Runner.run(agent, question, max_turns=3)
    return math_reward(str(result.final_output), sample.answer or "", require_evaluated=True)


async def run_required(client: Any, sample: Sample) -> float:
    """The same program asking for a tool call on its first turn, one call at a time (the SDK resets
    tool_choice to auto after a tool ran, so the answer may be text)."""
    return await run(client, sample, ModelSettings(tool_choice="required", parallel_tool_calls=False))


def sdk_episodes(server: EndpointServer, fn: str = "run") -> AgentEpisodes:
    return AgentEpisodes(
        load_agent(f"tests.sdk.test_openai_agents:{fn}"),
        server,
        concurrency=4,
        timeout_s=60,
        max_completions=4,
    )


@pytest.mark.parametrize("fn", ["run", "run_required"])
def test_an_agents_sdk_program_calls_its_tool_and_its_episodes_are_token_exact_and_scored(
    fn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[ChatRequest] = []  # what the SDK's requests asked, as the endpoint read them
    monkeypatch.setattr(endpoint, "read_request", lambda body: asked.append(read_request(body)) or asked[-1])
    tokenizer = build_byte_tokenizer()
    sampler = ScriptedSampler(tokenizer, calculator_reply)  # calls the calculator, then answers its result
    samples = ToolArithmetic.make_samples(3, 0, "train")
    with EndpointServer(sampler, tokenizer) as server:  # type: ignore[arg-type]
        played = sdk_episodes(server, fn).play(
            samples, SamplingParams(n=1, temperature=1.0, max_new_tokens=96)
        )
    assert played.metrics["env/errors"] == 0.0 and len(played.rollouts) == 3
    assert played.metrics["env/tool_choice_violations"] == 0.0
    # Three first turns, then three after the tool ran (the SDK resets tool_choice to auto).
    choices = sorted((r.tool_choice, r.parallel_tool_calls) for r in asked)
    if fn == "run_required":
        assert choices == [("auto", False)] * 3 + [("required", False)] * 3
    else:
        assert choices == [("auto", True)] * 6
    served = {
        tuple(q.prompt_ids): o for reqs, _, outs in sampler.calls for q, o in zip(reqs, outs, strict=True)
    }
    assert len(served) == 6  # a tool call and an answer per episode
    for r, sample in zip(played.rollouts, samples, strict=True):
        assert r.turn_rewards == [1.0] and r.metrics["episode/segments"] == 1 and len(r.turns) == 2
        # Each turn is the sampler's output for the context before it, token for token, and only the
        # sampled tokens are trained on, with the sampler's log-probs.
        for a, b in r.turns:
            out = served[tuple(r.token_ids[: r.prompt_len + a])]
            assert r.response_ids[a:b] == out.response_ids and r.sampler_logprobs[a:b] == out.sampler_logprobs
        assert sum(r.loss_mask) == sum(b - a for a, b in r.turns)
        # The SDK ran the tool: its result is the observation between the two turns.
        (_, end1), (start2, _) = r.turns
        observation = tokenizer.decode(r.response_ids[end1:start2])
        assert observation == f"\ntool: {sample.answer}\nassistant: "


def test_an_agents_sdk_program_on_a_real_sampler_records_its_tokens_and_logprobs(
    micro_model_dir: Path,
) -> None:
    policy = Policy.from_pretrained(str(micro_model_dir))
    sampler = HFSampler(policy.model, policy.tokenizer)
    seen = record_generations(sampler)
    samples = ToolArithmetic.make_samples(2, 0, "train")
    with EndpointServer(sampler, policy.tokenizer) as server:
        played = sdk_episodes(server).play(samples, SamplingParams(n=1, temperature=1.0, max_new_tokens=12))
    assert played.metrics["env/errors"] == 0.0 and len(played.rollouts) == 2
    for r in played.rollouts:  # a random model writes no tool call: one turn, scored 0 by the agent
        [(prompt, out)] = [(p, o) for p, o in seen if p == r.token_ids[: r.prompt_len]]
        assert r.token_ids == prompt + out.response_ids and r.loss_mask == [1] * out.response_len
        assert r.sampler_logprobs == out.sampler_logprobs and r.turn_rewards == [0.0]


def test_training_an_agents_sdk_program_runs(tmp_path: Path, micro_model_dir: Path) -> None:
    overrides = {
        "data.task": "null",
        "env.name": "tool_arithmetic",
        "rollout.agent": "tests.sdk.test_openai_agents:run",
        "rollout.max_new_tokens": 8,
        "reward.fn": "env",
        "data.eval_size": 2,
        "data.prompts_per_step": 2,
        "rollout.n": 2,
        "run.eval_every": 0,
        "run.save_every": 0,
        "run.steps": 1,
    }
    result = train(load_config(None, tiny_overrides(tmp_path, micro_model_dir, "sdk", **overrides)))
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    [trained] = [row for row in rows if "loss/policy" in row]
    assert trained["env/errors"] == 0.0 and trained["env/tool_choice_violations"] == 0.0
    assert trained["episode/turns"] >= 1 and "reward/mean" in trained

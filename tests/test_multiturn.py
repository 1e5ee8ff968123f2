"""Multi-turn rollouts: token layout and loss mask, exact sampled tokens, limits, concurrency of
environments, and that observation tokens get exactly zero gradient."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from hone.algorithms import POLICY_LOSSES, aggregate_loss
from hone.config import load_config
from hone.envs import Environment, StepResult, make_env
from hone.rewards.env import env_reward
from hone.rewards.math import math_verifier
from hone.rewards.resolve import all_assistant_text, load_reward
from hone.rl.evaluate import evaluate
from hone.rollout import HFSampler
from hone.rollout.multiturn import EpisodeLimits, Episodes, demonstration_tokens, run_episodes
from hone.training.collate import collate, turn_tensors
from hone.training.policy import Policy
from hone.types import Rollout, Sample, SamplingParams
from tests.helpers import Scripted

# Log-prob agreement of two computations of the same tokens, compared in float64: they differ only in
# summation order (~1e-16 relative per operation, ~1e-14 over this 2-layer model), while a wrong token or
# position moves a log-prob by >= 1e-3. An fp32 bound (~1e-5 here) would depend on the CPU's kernels.
ATOL = 1e-10


@pytest.fixture(scope="module")
def policy(micro_model_dir: Path) -> Policy:
    return Policy.from_pretrained(str(micro_model_dir))


@pytest.fixture(scope="module")
def policy64(micro_model_dir: Path) -> Policy:
    """The same micro model in float64, for exact comparisons (greedy ties and log-probs alike)."""
    policy = Policy.from_pretrained(str(micro_model_dir))
    policy.model.double()
    return policy


class Echo(Environment):
    """Replies "obs <n>" to every turn; done after `turns` turns with reward = turns seen."""

    max_turns = 8

    def __init__(self, turns: int = 3) -> None:
        self.turns, self.seen = turns, 0

    def reset(self, sample: Sample) -> list[dict[str, str]]:
        return [{"role": "user", "content": sample.prompt or ""}]

    async def step(self, assistant_message: str) -> StepResult:
        self.seen += 1
        await asyncio.sleep(0)
        done = self.seen >= self.turns
        return StepResult(
            [{"role": "user", "content": f"obs {self.seen}"}], float(done), done, {"steps": 1.0}
        )


def play(policy: Policy, make, samples: list[Sample], limits: EpisodeLimits, n: int = 2) -> list[Rollout]:
    sampler = HFSampler(policy.model, policy.tokenizer)
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=limits.max_tokens_per_turn, seed=3)
    return run_episodes(sampler, policy.tokenizer, make, samples, params, limits)


SAMPLES = [Sample("a", prompt="hi"), Sample("b", prompt="yo")]


def test_trajectory_layout_masks_exactly_the_observation_tokens(policy: Policy) -> None:
    tok = policy.tokenizer
    rollouts = play(policy, lambda: Echo(3), SAMPLES, EpisodeLimits(max_turns=5, max_tokens_per_turn=6))
    assert [r.sample_id for r in rollouts] == ["a", "a", "b", "b"] and [r.group_id for r in rollouts] == [
        0,
        0,
        1,
        1,
    ]
    for r in rollouts:
        assert len(r.turns) == 3 and r.turn_rewards == [0.0, 0.0, 1.0] and r.finish_reason == "stop"
        assert len(r.loss_mask) == len(r.sampler_logprobs) == r.response_len
        trained = {i for start, end in r.turns for i in range(start, end)}
        assert {i for i, m in enumerate(r.loss_mask) if m} == trained
        # the masked stretches are precisely the template's observation text
        observations = [
            tok.decode(r.response_ids[end:next_start])
            for (_, end), (next_start, _) in zip(r.turns, r.turns[1:], strict=False)
        ]
        for k, text in enumerate(observations, start=1):
            assert text.endswith(f"user: obs {k}\nassistant: ")
        assert all(lp == 0.0 for lp, m in zip(r.sampler_logprobs, r.loss_mask, strict=True) if not m)
        assert r.metrics["env/steps"] == 3.0 and r.metrics["episode/turns"] == 3.0


def test_sampled_tokens_are_kept_exactly_and_score_alike_in_the_trainer(policy64: Policy) -> None:
    rollouts = play(policy64, lambda: Echo(2), SAMPLES, EpisodeLimits(max_turns=4, max_tokens_per_turn=5))
    batch = collate(rollouts, pad_id=policy64.tokenizer.pad_token_id)
    with torch.no_grad():
        log_probs, _ = policy64.token_log_probs(batch.input_ids, batch.attention_mask)
    diff = (log_probs - batch.sampler_log_probs).abs() * batch.response_mask
    # No re-tokenisation drift: the trainer sees the sampled ids. The float64 model agrees to ~1e-14; the
    # trainer hands back float32 (and collate stores float32), i.e. log p ~ -6 rounded to 2^-24 relative
    # (~4e-7) plus a few ulps from its float32 logsumexp: 1e-5 bounds that, a wrong id moves it by >= 1e-3.
    assert float(diff.max()) < 1e-5


def test_prefix_cache_plays_the_same_episodes_as_re_encoding_every_turn(policy64: Policy) -> None:
    limits = EpisodeLimits(max_turns=4, max_tokens_per_turn=5)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=5)
    episodes = []
    for prefix_cache in (True, False):
        sampler = HFSampler(policy64.model, policy64.tokenizer, prefix_cache=prefix_cache)
        episodes.append(run_episodes(sampler, policy64.tokenizer, lambda: Echo(3), SAMPLES, params, limits))
    cached, fresh = episodes
    assert [r.token_ids for r in cached] == [r.token_ids for r in fresh]
    assert all(len(r.turns) == 3 for r in cached)
    for a, b in zip(cached, fresh, strict=True):
        torch.testing.assert_close(
            torch.tensor(a.sampler_logprobs, dtype=torch.float64),
            torch.tensor(b.sampler_logprobs, dtype=torch.float64),
            atol=ATOL,
            rtol=0,
        )


def test_observation_and_prompt_tokens_get_exactly_zero_gradient(policy: Policy) -> None:
    rollouts = play(policy, lambda: Echo(3), SAMPLES, EpisodeLimits(max_turns=4, max_tokens_per_turn=5))
    batch = collate(rollouts, pad_id=policy.tokenizer.pad_token_id)
    log_probs, _ = policy.token_log_probs(batch.input_ids, batch.attention_mask)
    log_probs.retain_grad()
    advantages = torch.randn_like(log_probs)
    loss_per_token, _ = POLICY_LOSSES["ppo"](
        log_probs=log_probs,
        old_log_probs=batch.sampler_log_probs,
        advantages=advantages,
        response_mask=batch.response_mask,
    )
    aggregate_loss(loss_per_token, batch.response_mask, "token-mean").backward()
    grad = log_probs.grad
    assert grad is not None
    assert torch.count_nonzero(grad * (1 - batch.response_mask)) == 0
    assert torch.count_nonzero(grad * batch.response_mask) == int(batch.response_mask.sum())


def test_turn_tensors_align_turns_with_response_columns(policy: Policy) -> None:
    rollouts = play(
        policy, lambda: Echo(3), SAMPLES[:1], EpisodeLimits(max_turns=4, max_tokens_per_turn=4), n=1
    )
    r = rollouts[0]
    r.reward = 5.0  # the reward layer's total: the env's 1.0 on turn 3, the rest arrives with the last turn
    batch = collate(rollouts, pad_id=policy.tokenizer.pad_token_id)
    turns = turn_tensors(rollouts, batch.response_mask.shape[1])
    assert turns["turn_rewards"].tolist() == [[0.0, 0.0, 5.0]] and turns["turn_mask"].tolist() == [
        [1.0, 1.0, 1.0]
    ]
    assert torch.equal((turns["token_turns"] >= 0).float(), batch.response_mask)


def test_limits_end_episodes_cleanly_and_mark_truncation(policy: Policy) -> None:
    by_turns = play(policy, lambda: Echo(10), SAMPLES[:1], EpisodeLimits(max_turns=2, max_tokens_per_turn=4))
    assert all(len(r.turns) == 2 and r.finish_reason == "length" for r in by_turns)
    assert all(r.metrics["episode/truncated"] == 1.0 for r in by_turns)
    tight = EpisodeLimits(max_turns=8, max_tokens_per_turn=4, max_total_tokens=30)
    by_tokens = play(policy, lambda: Echo(10), SAMPLES[:1], tight)
    assert all(len(r.token_ids) <= 30 and r.finish_reason == "length" for r in by_tokens)


def test_an_episode_plays_alike_alone_and_beside_an_episode_with_less_room(policy64: Policy) -> None:
    tok = policy64.tokenizer
    short, long = Sample("short", prompt="hi"), Sample("long", prompt="x" * 40)
    long_prompt = len(
        tok.apply_chat_template([{"role": "user", "content": long.prompt}], add_generation_prompt=True)[
            "input_ids"
        ]
    )
    # The long episode has room for 3 tokens; the short one for two whole 6-token turns and an observation.
    limits = EpisodeLimits(max_turns=3, max_tokens_per_turn=6, max_total_tokens=long_prompt + 3)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)

    def episodes(samples: list[Sample]) -> list[Rollout]:
        sampler = HFSampler(policy64.model, tok)
        return run_episodes(sampler, tok, lambda: Echo(2), samples, params, limits)

    (alone,) = episodes([short])
    beside, cut = episodes([short, long])
    assert alone.turns[0][1] - alone.turns[0][0] > 3  # the long episode's room would have cut this turn
    assert (beside.token_ids, beside.turns, beside.response_text) == (
        alone.token_ids,
        alone.turns,
        alone.response_text,
    )
    assert (beside.turn_rewards, beside.finish_reason, beside.metrics) == (
        alone.turn_rewards,
        "stop",
        alone.metrics,
    )
    torch.testing.assert_close(
        torch.tensor(beside.sampler_logprobs, dtype=torch.float64),
        torch.tensor(alone.sampler_logprobs, dtype=torch.float64),
        atol=ATOL,
        rtol=0,
    )
    assert (
        cut.turns == [(0, 3)]
        and cut.finish_reason == "length"
        and len(cut.token_ids) == limits.max_total_tokens
    )


def test_a_turn_ended_by_a_secondary_eos_gets_no_second_end_of_turn(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = policy.tokenizer
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=4)
    limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=4)

    def episode() -> Rollout:
        sampler = HFSampler(policy.model, tok)
        return run_episodes(sampler, tok, lambda: Echo(2), SAMPLES[:1], params, limits)[0]

    first_token = episode().response_ids[0]
    assert first_token != tok.eos_token_id
    # Chat models list several terminators (Qwen: <|im_end|> and <|endoftext|>): make the token this greedy
    # episode starts with the second one, so its first turn ends on it at once.
    monkeypatch.setattr(policy.model.generation_config, "eos_token_id", [tok.eos_token_id, first_token])
    rollout = episode()
    (_, end), (start, _) = rollout.turns
    # The turn is the sampled eos alone; the template closes an assistant turn with "<eos>\n", and the
    # turn has ended, so only the "\n" follows: one end-of-turn token, the one the model sampled.
    assert rollout.response_ids[:end] == [first_token]
    assert rollout.response_ids[end:start] == tok.encode(
        "\nuser: obs 1\nassistant: ", add_special_tokens=False
    )


@pytest.mark.parametrize("template_end_stops", [True, False])
def test_the_sampled_eos_replaces_the_templates_end_of_turn_token(
    policy: Policy, template_end_stops: bool
) -> None:
    # Each turn ends on "<", a secondary eos whose text starts the template's end-of-turn token "<eos>".
    # The sampler may also stop on "<eos>" (Qwen-Instruct: <|im_end|> and <|endoftext|>) or not (a base
    # model's config stopping on <|endoftext|> under a <|im_end|> template): either way the template's
    # "<eos>" is dropped as a token, never "<" as a text prefix of it.
    tok = policy.tokenizer
    (lt,) = tok.encode("<", add_special_tokens=False)
    eos_ids = frozenset([lt, tok.eos_token_id] if template_end_stops else [lt])
    sampler = Scripted(tok, ["hi", "bye"], end=lt, eos_ids=eos_ids)
    limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=8)
    (rollout,) = run_episodes(sampler, tok, lambda: Echo(2), SAMPLES[:1], SamplingParams(n=1), limits)

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    assert rollout.response_ids == [
        *encode("hi"),
        lt,
        *encode("\nuser: obs 1\nassistant: "),
        *encode("bye"),
        lt,
    ]


class ToolSays(Environment):
    """A tool result holding the sample's answer after turn 1; done after turn 2."""

    max_turns = 2

    def reset(self, sample: Sample) -> list[dict[str, str]]:
        self.answer, self.seen = sample.answer, 0
        return [{"role": "user", "content": "What is 987654320 + 1?"}]

    def step(self, assistant_message: str) -> StepResult:
        self.seen += 1
        return StepResult([{"role": "tool", "content": f"result: {self.answer}"}], 0.0, self.seen == 2)


@pytest.mark.parametrize(("final", "expected"), [("no idea", 0.0), ("it is 987654321", 1.0)])
def test_text_rewards_score_the_final_assistant_message_not_the_observations(
    policy: Policy, final: str, expected: float
) -> None:
    sample = Sample("s", prompt="", answer="987654321")
    sampler = Scripted(policy.tokenizer, ["let me call the tool", final])
    params = SamplingParams(n=1, max_new_tokens=24)
    limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=24)
    (rollout,) = run_episodes(sampler, policy.tokenizer, ToolSays, [sample], params, limits)
    assert [m["content"] for m in rollout.messages if m["role"] == "tool"] == ["result: 987654321"]
    assert math_verifier()(rollout, sample) == expected
    assert rollout.response_text == final


@pytest.mark.parametrize(
    ("replies", "final", "all_"),
    [
        (["let me call the tool", "no idea"], 0.0, 0.0),  # the tool's answer counts in neither
        (["it is 987654321", "let me check that"], 0.0, 1.0),  # said early, not repeated at the end
    ],
)
def test_text_rewards_with_text_all_score_every_assistant_message(
    policy: Policy, replies: list[str], final: float, all_: float
) -> None:
    sample = Sample("s", prompt="", answer="987654321")
    limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=24)
    sampler = Scripted(policy.tokenizer, replies)
    (rollout,) = run_episodes(sampler, policy.tokenizer, ToolSays, [sample], SamplingParams(n=1), limits)
    assert rollout.assistant_text("all") == "\n".join(replies)
    for args, expected in (("{}", final), ("{text: final}", final), ("{text: all}", all_)):
        scorer = load_reward(load_config(None, ["reward.fn=math", f"reward.args={args}"]).reward, None)
        scorer.score([rollout], {"s": sample})
        assert rollout.reward == expected
    with pytest.raises(ValueError, match="text must be 'final'"):
        load_reward(load_config(None, ["reward.fn=format", "reward.args={text: every}"]).reward, None)
    with pytest.raises(ValueError, match="bad args"):  # a reward that reads no text takes no `text`
        load_reward(
            load_config(
                None, ["reward.fn=overlong", "reward.args={max_len: 8, buffer: 2, text: all}"]
            ).reward,
            None,
        )


def test_assistant_text_all_is_the_sampled_replies_only() -> None:
    messages = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},  # a few-shot turn of the prompt, not sampled
        {"role": "user", "content": "987654320+1?"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "987654321"},
        {"role": "assistant", "content": "b"},
    ]
    rollout = Rollout("s", 0, [1, 2, 3, 4], 1, [1, 0, 1], [0.0] * 3, "b", turns=[(0, 1), (2, 3)])
    rollout.messages = messages
    assert (rollout.assistant_text(), rollout.assistant_text("all")) == ("b", "a\nb")

    class Lengths:  # a batch reward (a reward model) sees the joined text too
        def score_batch(self, rollouts: list[Rollout], samples: list[Sample]) -> list[float]:
            return [float(len(r.response_text)) for r in rollouts]

    assert all_assistant_text(Lengths()).score_batch([rollout], [Sample("s")]) == [3.0]
    single = Rollout("s", 0, [1, 2], 1, [1], [0.0], "the answer")
    assert single.assistant_text("all") == "the answer"
    with pytest.raises(ValueError, match="which must be"):
        rollout.assistant_text("every")  # type: ignore[arg-type]


def test_environments_step_concurrently_one_instance_per_trajectory(policy: Policy) -> None:
    instances: list[Environment] = []

    class Meet(Echo):
        async def step(self, assistant_message: str) -> StepResult:
            instances.append(self)
            await asyncio.wait_for(barrier.wait(), timeout=5)  # all 4 must be stepping at once
            return await super().step(assistant_message)

    barrier = asyncio.Barrier(4)
    rollouts = play(policy, lambda: Meet(1), SAMPLES, EpisodeLimits(max_turns=2, max_tokens_per_turn=3))
    assert all(r.turn_rewards == [1.0] for r in rollouts)
    assert len({id(e) for e in instances}) == 4


def test_demonstrations_use_the_same_layout_as_episodes(policy: Policy) -> None:
    tok = policy.tokenizer
    env = make_env("guess_number", {})()
    sample = type(env).make_samples(1, 0, "train")[0]
    ids, mask = demonstration_tokens(tok, env.demonstration(sample), env.tools)
    assert len(ids) == len(mask) and mask[0] == 0
    trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assistant = [m["content"] for m in env.demonstration(sample) if m["role"] == "assistant"]
    assert trained == "".join(a + tok.eos_token for a in assistant)


class SolvesAtTurn(Environment):
    """Done with reward 1 at the turn the sample's `meta["turn"]` names; fails (reward 0) at turn 3."""

    max_turns = 3

    def reset(self, sample: Sample) -> list[dict[str, str]]:
        self.solve_at, self.seen = sample.meta["turn"], 0
        return [{"role": "user", "content": "go"}]

    def step(self, assistant_message: str) -> StepResult:
        self.seen += 1
        solved = self.seen == self.solve_at
        return StepResult([{"role": "user", "content": "again"}], float(solved), solved or self.seen == 3)


def test_eval_splits_multi_turn_accuracy_by_the_turns_correct_episodes_took(policy: Policy) -> None:
    samples = [Sample(str(i), prompt="go", meta={"turn": t}) for i, t in enumerate([1, 2, 2, 3, 9])]
    episodes = Episodes(SolvesAtTurn, EpisodeLimits(max_turns=3, max_tokens_per_turn=3))
    metrics = evaluate(
        HFSampler(policy.model, policy.tokenizer),
        policy.tokenizer,
        samples,
        env_reward(),
        SamplingParams(n=2, temperature=1.0, max_new_tokens=3, seed=0),
        episodes=episodes,
    )
    assert metrics["eval/accuracy"] == 0.8  # the sample with turn 9 is never solved
    assert [metrics[f"eval/correct_in_{k}_turns"] for k in (1, 2, 3)] == [0.2, 0.4, 0.2]
    assert "eval/correct_in_4_turns" not in metrics


def test_demonstration_turns_with_weight_zero_stay_in_context_but_are_not_trained_on(policy: Policy) -> None:
    tok = policy.tokenizer
    messages = [
        {"role": "user", "content": "12+30="},
        {"role": "assistant", "content": "43", "weight": 0},
        {"role": "user", "content": "wrong"},
        {"role": "assistant", "content": "42"},
    ]
    ids, mask = demonstration_tokens(tok, messages)
    # The layout of an episode whose turns end on the tokenizer's eos, in a sampler stopping on it too.
    (lt,) = tok.encode("<", add_special_tokens=False)
    assert demonstration_tokens(tok, messages, eos_ids=frozenset([lt, tok.eos_token_id])) == (ids, mask)
    with pytest.raises(ValueError, match=rf"generation stops on ids \[{lt}\] only"):
        demonstration_tokens(tok, messages, eos_ids=frozenset([lt]))  # SFT would teach a non-stop end
    assert "43" in tok.decode(ids)  # the miss is in the context
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == "42" + tok.eos_token
    with pytest.raises(ValueError, match="weight"):
        demonstration_tokens(tok, [messages[0], {"role": "assistant", "content": "42", "weight": 0.5}])


def test_an_agent_recipe_trains_end_to_end_with_sft_from_demonstrations(
    tmp_path: Path, micro_model_dir: Path
) -> None:
    from hone.config import load_config
    from hone.rl.loop import train
    from tests.helpers import tiny_overrides

    overrides = tiny_overrides(
        tmp_path,
        micro_model_dir,
        "agent",
        **{
            "data.task": "null",
            "env.name": "guess_number",
            "env.args": "{high: 8}",
            "env.max_tokens_per_turn": 3,
            "reward.fn": "env",
            "algorithm.advantage": "turn_grpo",
            "algorithm.gamma": 0.9,
            "run.steps": 2,
            "sft.enabled": "true",
            "sft.max_steps": 2,
            "sft.examples": 16,
            "sft.val_size": 4,
            "sft.eval_every": 1,
        },
    )
    result = train(load_config("agent-guess", overrides))
    assert result.steps == 2
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    step = rows[-1]
    assert {"episode/turns", "episode/truncated", "reward/mean", "loss/policy", "eval/accuracy"} <= set(step)
    assert 1 <= step["episode/turns"] <= 7  # the loop's limit: GuessNumber.max_turns
    sft_log = (result.run_dir / "sft" / "sft_log.jsonl").read_text()
    assert '"sft/eval"' in sft_log


def test_the_environments_args_shape_the_runs_samples() -> None:
    from hone.config import load_config
    from hone.envs import make_env as build_env
    from tests.helpers import run_splits

    cfg = load_config("agent-retry", ["data.train_size=50", "data.eval_size=20"])
    _, train, held_out = run_splits(cfg, build_env(cfg.env.name, cfg.env.args))
    # agent-retry asks for zero-padded 2–3-digit additions: "045+367=" → "0412"
    assert all(len(s.prompt or "") == 8 and "+" in (s.prompt or "") for s in train + held_out)
    assert all(len(s.answer or "") == 4 for s in train + held_out)


def test_an_environment_written_as_its_own_program_is_one_file(micro_model_dir: Path) -> None:
    """docs/architecture.md's worked example: `SelfCheck.play` calls the model twice through `chat`; the
    rollout loop records both turns token for token and grades the episode by what `play` returns."""
    tok = Policy.from_pretrained(str(micro_model_dir)).tokenizer
    make = make_env("tests.self_check_env_for_tests:SelfCheck")
    samples = [Sample("s0", prompt="2+3=", answer="5"), Sample("s1", prompt="4+4=", answer="9")]
    limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=8, max_total_tokens=512)
    rollouts = run_episodes(Scripted(tok, ["6", "5"]), tok, make, samples, SamplingParams(n=1), limits)
    assert [len(r.turns) for r in rollouts] == [2, 2]
    assert [r.turn_rewards for r in rollouts] == [[0.0, 1.0], [0.0, 0.0]]  # graded on the second reply
    assert [r.metrics["env/changed"] for r in rollouts] == [1.0, 1.0]
    for r in rollouts:  # the loss covers the two sampled replies and nothing the environment wrote
        sampled = [r.token_ids[r.prompt_len + i] for i, m in enumerate(r.loss_mask) if m]
        assert tok.decode(sampled, skip_special_tokens=True) == "65"

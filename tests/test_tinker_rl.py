"""RL on `hone serve tinker`: a loop in tinker-cookbook's style, written against the `tinker` SDK alone (its
async API), and the gap between the log-probs `sample` returns and those `forward` computes.

The server runs in this process (threads), the SDK's client over real HTTP, as in tests/test_tinker.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from hone.tinker.server import TinkerServer  # noqa: E402

API_KEY = "tml-local"
PROMPTS = ["a:", "b:", "c:", "d:"]
GROUP = 8  # samples per prompt: a group, whose mean reward is its baseline
MAX_TOKENS = 6
TARGET = "e"  # the reward: the share of a completion's tokens that are this one


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerServer]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's steps are fastest so (see tests/test_tinker.py)
    try:
        run_dir = tmp_path_factory.mktemp("tinker-rl")
        with TinkerServer(run_dir, base_models=["tiny"], port=0, device="cpu", preload=True) as srv:
            yield srv
    finally:
        torch.set_num_threads(threads)


# The program under test: the SDK and numpy only.


def reward(tokens: list[int], target: int) -> float:
    return sum(t == target for t in tokens) / len(tokens)


def rl_datum(prompt: list[int], seq: types.SampledSequence, advantage: float) -> types.Datum:
    """The cookbook's RL datum: the prompt and the completion shifted by one, the sampler's log-probs and the
    advantage on the completion's tokens, zeros on the prompt's."""
    tokens = prompt + list(seq.tokens)
    n_prompt = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * n_prompt + [float(x) for x in seq.logprobs],
            "advantages": [0.0] * n_prompt + [advantage] * len(seq.tokens),
        },
    )


def logprob_gap(data: list[types.Datum], output: types.ForwardBackwardOutput, n_prompt: list[int]) -> float:
    """Largest |sampler log-prob - forward log-prob| over the datums' completion tokens (after the first
    `n_prompt` positions, which are the prompt's)."""
    gaps = [
        np.abs(out["logprobs"].to_numpy()[n:] - datum.loss_fn_inputs["logprobs"].to_numpy()[n:]).max()
        for datum, out, n in zip(data, output.loss_fn_outputs, n_prompt, strict=True)
    ]
    return float(max(gaps))


async def rl_loop(service: Any, iterations: int, lr: float) -> tuple[list[float], float]:
    """GRPO-style: sample a group per prompt, centre each group's rewards, one importance_sampling step on
    the sampler's log-probs, new sampler weights. Returns each iteration's mean reward, and the largest gap
    between a sampled token's log-prob and the one forward_backward computed for it."""
    client = await service.create_lora_training_client_async(base_model="tiny", rank=8)
    tokenizer = client.get_tokenizer()
    (target,) = tokenizer.encode(TARGET, add_special_tokens=False)
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    sampler = await client.save_weights_and_get_sampling_client_async()
    means, gap = [], 0.0
    for step in range(iterations):
        results = await asyncio.gather(
            *(
                sampler.sample_async(
                    prompt=types.ModelInput.from_ints(p),
                    num_samples=GROUP,
                    sampling_params=types.SamplingParams(
                        max_tokens=MAX_TOKENS, temperature=1.0, stop=[], seed=step * 100 + i
                    ),
                )
                for i, p in enumerate(prompts)
            )
        )
        data, rewards = [], []
        for prompt, result in zip(prompts, results, strict=True):
            group = [reward(list(s.tokens), target) for s in result.sequences]
            rewards += group
            baseline = float(np.mean(group))
            data += [rl_datum(prompt, s, r - baseline) for s, r in zip(result.sequences, group, strict=True)]
        means.append(float(np.mean(rewards)))
        # Both requests are queued before either is awaited, as the cookbook does.
        fwd_bwd = await client.forward_backward_async(data, "importance_sampling")
        optim = await client.optim_step_async(types.AdamParams(learning_rate=lr))
        output = await fwd_bwd.result_async()
        await optim.result_async()
        gap = max(gap, logprob_gap(data, output, [len(p) - 1 for p in prompts for _ in range(GROUP)]))
        sampler = await client.save_weights_and_get_sampling_client()  # 0.38's style: await the future
    return means, gap


# The tests.


# SDK 0.38 deprecates the `*_async` methods (its futures are awaitable) but still has them, and programs
# written for earlier SDKs (tinker-cookbook's among them) call them: the loop exercises them on purpose.
@pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")
def test_rl_loop_raises_the_reward(server: TinkerServer) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    try:
        means, gap = asyncio.run(rl_loop(service, iterations=8, lr=3e-2))
    finally:
        service.close("success").result()
    print(f"mean reward per iteration: {[round(m, 3) for m in means]}; max |sample - forward| {gap:.2e}")
    assert np.mean(means[-2:]) > 2 * np.mean(means[:2]) + 0.1, means
    assert gap < 1e-4, gap  # the sampler's log-probs are the trainer's, to fp32 rounding


def test_sample_and_forward_logprobs_agree(server: TinkerServer) -> None:
    """The log-probs `sample` returns (temperature 1) against those `forward` computes for the same tokens,
    on a LoRA moved off zero, over prompts of several lengths and 48 sampled tokens each."""
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    client = service.create_lora_training_client(base_model="tiny", rank=8).result()
    tokenizer = client.get_tokenizer()
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ["x", "hello:", "a longer prompt here"]]
    # One step on some text, so the adapter is not zero (B starts at zero: that would be the base model).
    text = types.ModelInput.from_ints(prompts[2][:-1])
    warm = types.Datum(model_input=text, loss_fn_inputs={"target_tokens": prompts[2][1:]})
    client.forward_backward([warm], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=48, temperature=1.0, stop=[], seed=7)
    data, n_prompt = [], []
    for prompt in prompts:
        for seq in sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result().sequences:
            data.append(rl_datum(prompt, seq, 0.0))
            n_prompt.append(len(prompt) - 1)
    gap = logprob_gap(data, client.forward(data, "cross_entropy").result(), n_prompt)
    service.close("success").result()
    print(f"max |sample - forward| log-prob over {48 * len(data)} tokens: {gap:.2e}")
    assert 0.0 <= gap < 1e-4, gap

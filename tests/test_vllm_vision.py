"""The vLLM engine on image prompts (the tiny Qwen2.5-VL), against the trainer, on this CPU.

One engine serves every check (a start and its first image batch cost ~40-60 s): two prompts with other
images (one non-square), two samples each; the ids vLLM expanded the placeholders to are the request's
(what the trainer scores); the sampled tokens' log-probs are the trainer's recomputation with the same
images; and the vision tokens, made the likeliest tokens by far in this model's head, are never sampled.

Needs the vLLM environment (`make setup-vllm`), so it runs under `make test-vllm` like tests/test_vllm.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image, ImageDraw

from hone.models.vision import vision_token_ids
from hone.rollout import eos_token_ids
from hone.rollout.base import GenerationRequest
from hone.rollout.engines.vllm import VLLMEngineError, VLLMSampler
from hone.rollout.prompts import encode_prompt
from hone.training.collate import collate
from hone.training.policy import Policy
from hone.types import Sample, SamplingParams
from tests.test_vllm import LOGPROB_ATOL, PYTHON

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not PYTHON.exists(), reason=f"no vLLM environment at {PYTHON} (make setup-vllm)"),
]
BOOST = 50.0  # the vision tokens' head rows are scaled by this: unbanned, they would be sampled


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2.5-VL (head dim 64, tied embeddings) with its vision tokens' head rows boosted."""
    from hone.models.tiny_vl import build_tiny_vl_model

    path = build_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl-vllm") / "m")
    policy = Policy.from_pretrained(path)
    banned = vision_token_ids(policy.model.config)
    with torch.no_grad():
        policy.model.get_output_embeddings().weight[banned] *= BOOST
    policy.model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def engine(vl_dir: Path) -> Iterator[tuple[Policy, VLLMSampler]]:
    policy = Policy.from_pretrained(vl_dir)
    sampler = VLLMSampler(
        vl_dir, policy.tokenizer, eos_token_ids(policy.model, policy.tokenizer), python=PYTHON
    )
    try:
        yield policy, sampler
    finally:
        sampler.close()


def shapes(n: int, color: str, size: tuple[int, int]) -> Image.Image:
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for k in range(n):
        draw.rectangle((4 + 12 * k, 4 + 6 * k, 12 + 12 * k, 12 + 6 * k), fill=color)
    return image


def ask(policy: Policy, sample_id: str, image: Image.Image, text: str) -> GenerationRequest:
    content: list[dict[str, Any]] = [{"type": "image"}, {"type": "text", "text": text}]
    sample = Sample(id=sample_id, messages=[{"role": "user", "content": content}], images=[image])
    ids, vision = encode_prompt(sample, policy.tokenizer, True, None, policy.processor)
    return GenerationRequest(sample_id, int(sample_id == "b"), ids, vision=vision)


def test_image_prompts_sample_what_the_trainer_scores(engine: tuple[Policy, VLLMSampler]) -> None:
    policy, sampler = engine
    requests = [
        ask(policy, "a", shapes(2, "red", (56, 56)), "How many?"),
        ask(policy, "b", shapes(3, "blue", (84, 28)), "Count the shapes, please."),  # non-square: 6x2 grid
    ]
    assert [r.vision.image_grid_thw.tolist() for r in requests if r.vision] == [[[1, 4, 4]], [[1, 2, 6]]]
    banned = vision_token_ids(policy.model.config)
    # Unbanned, the model would sample a vision token next: the ban check below can fail.
    for request in requests:
        assert request.vision is not None
        with torch.no_grad():
            logits = policy.model(
                input_ids=torch.tensor([request.prompt_ids]),
                pixel_values=request.vision.pixel_values,
                image_grid_thw=request.vision.image_grid_thw,
            ).logits[0, -1]
        assert torch.softmax(logits.float(), -1)[banned].sum() > 0.5

    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=3)
    rollouts = sampler.generate(requests, params)
    assert [r.sample_id for r in rollouts] == ["a", "a", "b", "b"]
    for k, rollout in enumerate(rollouts):
        request = requests[k // 2]
        assert rollout.vision is request.vision
        assert rollout.token_ids[: rollout.prompt_len] == request.prompt_ids  # vLLM's expansion is ours
        assert not set(rollout.response_ids) & set(banned)
    assert rollouts[0].response_ids != rollouts[1].response_ids  # the n samples are their own draws

    batch = collate(rollouts, pad_id=policy.tokenizer.pad_token_id)
    with torch.no_grad():
        trained, _ = policy.token_log_probs(batch.input_ids, batch.attention_mask, vision=batch.vision)
    mask = batch.response_mask
    assert mask.sum() == sum(len(r.response_ids) for r in rollouts)
    diff = ((trained - batch.sampler_log_probs) * mask).abs().max().item()
    print(f"image prompts: max |sampler - trainer| log-prob = {diff:.2e}")
    assert diff < LOGPROB_ATOL
    assert policy.banned_ids is not None and sorted(policy.banned_ids.tolist()) == banned


def test_an_image_request_without_its_original_images_fails_in_one_line(
    engine: tuple[Policy, VLLMSampler],
) -> None:
    import dataclasses

    policy, sampler = engine
    request = ask(policy, "a", shapes(1, "red", (56, 56)), "How many?")
    assert request.vision is not None
    stripped = dataclasses.replace(request, vision=dataclasses.replace(request.vision, images=()))
    with pytest.raises(VLLMEngineError, match="needs the original images"):
        sampler.generate([stripped], SamplingParams(max_new_tokens=4))
    text = GenerationRequest("t", 0, policy.tokenizer.encode("user: hi\nassistant: "))
    [rollout] = sampler.generate([text], SamplingParams(max_new_tokens=8, seed=1))  # text on the VL model
    assert not set(rollout.response_ids) & set(vision_token_ids(policy.model.config))


def test_after_a_publish_image_prompts_use_the_new_weights(engine: tuple[Policy, VLLMSampler]) -> None:
    """Every weight moves (the vision tower's too), is published, and the engine's image-prompt log-probs
    are the trainer's again: the tied head nested under `language_model` is re-packed and the vision
    tower's cached outputs are dropped (without either, the gap was 0.53, or the engine died)."""
    from hone.rl.placement.weights import LocalWeightChannel

    policy, sampler = engine
    requests = [ask(policy, "a", shapes(2, "red", (56, 56)), "How many?")]
    params = SamplingParams(n=2, max_new_tokens=12, seed=1)
    sampler.generate(requests, params)  # the image's vision-tower output is in the engine's cache
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    LocalWeightChannel(policy.state_dict_for_sampler, sampler, timeout_s=120).publish(1)  # verified
    rollouts = sampler.generate(requests, params)
    batch = collate(rollouts, pad_id=policy.tokenizer.pad_token_id)
    with torch.no_grad():
        trained, _ = policy.token_log_probs(batch.input_ids, batch.attention_mask, vision=batch.vision)
    diff = ((trained - batch.sampler_log_probs) * batch.response_mask).abs().max().item()
    print(f"after a publish: max |sampler - trainer| log-prob = {diff:.2e}")
    assert diff < LOGPROB_ATOL


def test_a_verified_publish_passes_and_a_corrupted_vision_tensor_is_caught(
    engine: tuple[Policy, VLLMSampler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine reports its fingerprint under the learner's names (vLLM loads `model.visual.*` as
    `visual.*` and `model.language_model.*` as `language_model.model.*`, and fuses a vision block's
    gate/up), so a verified publish of the VLM passes; one flipped bit in one vision-tower tensor, on
    the way to the engine, is named."""
    from hone.rl.placement.weights import LocalWeightChannel
    from hone.rollout.engines import vllm as vllm_engine
    from hone.rollout.fingerprint import WeightMismatchError

    policy, sampler = engine
    channel = LocalWeightChannel(policy.state_dict_for_sampler, sampler, timeout_s=120)  # verified
    version = sampler.policy_version + 1
    channel.publish(version)
    held = sampler.weights_fingerprint([])
    for key in (
        "model.visual.patch_embed.proj.weight",
        "model.visual.blocks.1",
        "model.language_model.layers.1",
    ):
        assert key in held.sums
    real_save = vllm_engine.save_file
    corrupted = "model.visual.blocks.1.mlp.up_proj.weight"  # fused with gate_proj into gate_up_proj

    def flip_one_bit(tensors: dict[str, torch.Tensor], path: str) -> None:
        tensor = tensors[corrupted].clone()
        tensor.view(torch.int32).view(-1)[7] ^= 1 << 2
        real_save(tensors | {corrupted: tensor}, path)

    monkeypatch.setattr(vllm_engine, "save_file", flip_one_bit)
    with pytest.raises(
        WeightMismatchError, match=r"1 of \d+ tensor\(s\) differ, e\.g\. model\.visual\.blocks\.1 "
    ):
        channel.publish(version + 1)
    monkeypatch.setattr(vllm_engine, "save_file", real_save)
    channel.publish(version + 2)  # an honest load puts the engine right again

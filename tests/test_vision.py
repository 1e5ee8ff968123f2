"""Vision-language models: the tiny Qwen2.5-VL, image prompts through the HF engine and the trainer.

The checks the peers' trackers ask for: the sampler's log-probs of image prompts are what the trainer
recomputes (verl #1640, #3469), the positions both use are the model's `get_rope_index` ones (ROLL #104),
a policy never samples a vision token, and the same text with another image is another prompt (no KV cache
or log-prob pass shared).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from hone.models.vision import rope_positions, vision_token_ids
from hone.rollout.base import GenerationRequest
from hone.rollout.engines.hf import HFSampler
from hone.rollout.prompts import ImagePromptError, encode_prompt
from hone.training.collate import collate
from hone.training.policy import LoraSettings, Policy
from hone.types import Sample, SamplingParams, VisionBatch
from tests.helpers import shapes


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hone.models.tiny_vl import build_tiny_vl_model

    return build_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl") / "m")


@pytest.fixture(scope="module")
def policy(vl_dir: Path) -> Policy:
    return Policy.from_pretrained(vl_dir)


def ask(policy: Policy, sample_id: str, *images: Image.Image, text: str = "How many?") -> GenerationRequest:
    parts: list[dict[str, Any]] = [{"type": "image"} for _ in images]
    sample = Sample(
        id=sample_id,
        messages=[{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
        images=list(images),
    )
    ids, vision = encode_prompt(sample, policy.tokenizer, True, None, policy.processor)
    return GenerationRequest(sample_id, 0, ids, vision=vision)


def sampler(policy: Policy, **kw: Any) -> HFSampler:
    return HFSampler(policy.model, policy.tokenizer, **kw)


def trainer_log_probs(policy: Policy, rollouts: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    batch = collate(rollouts, pad_id=policy.tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = policy.token_log_probs(batch.input_ids, batch.attention_mask, vision=batch.vision)
    return lp * batch.response_mask, batch.sampler_log_probs * batch.response_mask


def test_tiny_vl_loads_as_a_vision_model_with_its_processor(policy: Policy) -> None:
    assert type(policy.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert policy.processor is not None
    request = ask(policy, "a", shapes(2))
    assert request.vision is not None
    # 56x56 -> a 4x4 patch grid -> 4 image tokens after the 2x2 merge, in place of the one placeholder.
    assert request.vision.image_grid_thw.tolist() == [[1, 4, 4]]
    image_id = policy.model.config.image_token_id
    assert request.prompt_ids.count(image_id) == 4 == sum(request.vision.tokens_per_image)
    assert policy.banned_ids is not None and image_id in policy.banned_ids.tolist()


def test_sampler_and_trainer_log_probs_agree_on_image_prompts(policy: Policy) -> None:
    # Images of two sizes (other grids, other position runs), two per prompt in one, groups of 3.
    requests = [
        ask(policy, "a", shapes(1)),
        ask(policy, "b", shapes(3, "blue", (56, 28)), text="Count the shapes, please."),
        ask(policy, "c", shapes(2), shapes(1, "green")),
    ]
    rollouts = sampler(policy).generate(requests, SamplingParams(n=3, max_new_tokens=12, seed=0))
    assert all(r.vision is requests[i // 3].vision for i, r in enumerate(rollouts))
    trained, sampled = trainer_log_probs(policy, rollouts)
    assert sampled.abs().sum() > 0
    assert torch.allclose(trained, sampled, atol=1e-5), (trained - sampled).abs().max()
    # Plain 1-D positions are measurably wrong on the same batch: the check can fail.
    batch = collate(rollouts, pad_id=policy.tokenizer.pad_token_id)
    with torch.no_grad():
        out = policy.model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=(batch.attention_mask.cumsum(-1) - 1).clamp(min=0),
            pixel_values=batch.vision.pixel_values,
            image_grid_thw=batch.vision.image_grid_thw,
        )
    one_d = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    assert ((one_d * batch.response_mask) - sampled).abs().max() > 1e-4


def test_sampler_positions_are_get_rope_index_of_the_whole_sequence(policy: Policy) -> None:
    seen: list[torch.Tensor] = []

    def spy(_module: torch.nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(kwargs["position_ids"].clone())

    handle = policy.model.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        request = ask(policy, "a", shapes(2, size=(56, 28)))
        [rollout] = sampler(policy, prefix_cache=False).generate(
            [request], SamplingParams(max_new_tokens=6, seed=1)
        )
    finally:
        handle.remove()
    ids = torch.tensor([rollout.token_ids])
    assert request.vision is not None
    expected = rope_positions(policy.model, ids, torch.ones_like(ids), request.vision.image_grid_thw)
    fed = torch.cat([p.reshape(3, -1) for p in seen], dim=1)  # prefill, then one column per decode step
    assert fed.shape[1] == len(rollout.token_ids) - 1  # the last sampled token is never fed
    assert torch.equal(fed, expected[:, 0, :-1])
    assert not torch.equal(expected[0, 0], torch.arange(ids.shape[1]))  # mRoPE, not 1-D positions


def test_the_same_text_with_another_image_is_another_prompt(policy: Policy) -> None:
    one, other = ask(policy, "a", shapes(1)), ask(policy, "b", shapes(4, "blue"))
    assert one.prompt_ids == other.prompt_ids and one.vision is not None and other.vision is not None
    assert one.vision.key != other.vision.key
    params = SamplingParams(n=2, max_new_tokens=8, temperature=0)
    cached = sampler(policy)
    cached.generate([one], params)  # fills the prefix cache with `one`'s image
    # A prompt that extends `one` as tokens, with the other image: must not reuse `one`'s KV.
    grown = GenerationRequest("c", 0, [*one.prompt_ids, 50, 51], vision=other.vision)
    [hit] = cached.generate([grown], SamplingParams(max_new_tokens=8, temperature=0))
    [fresh] = sampler(policy, prefix_cache=False).generate(
        [grown], SamplingParams(max_new_tokens=8, temperature=0)
    )
    assert hit.sampler_logprobs == pytest.approx(fresh.sampler_logprobs, abs=1e-5)
    # And in one batch, rows with the same ids and other images are prefilled apart.
    rollouts = sampler(policy).generate([one, other], params)
    assert rollouts[0].sampler_logprobs[0] != pytest.approx(rollouts[2].sampler_logprobs[0], abs=1e-6)


def test_a_prefix_cache_hit_feeds_only_the_new_images(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = ask(policy, "a", shapes(2))
    params = SamplingParams(max_new_tokens=5, temperature=0)
    cached = sampler(policy)
    [turn] = cached.generate([first], params)
    assert first.vision is not None
    # The next turn: the whole first turn, then a second image and more text.
    second_image = ask(policy, "x", shapes(3, "green"))
    assert second_image.vision is not None
    image_id = policy.model.config.image_token_id
    tail = second_image.prompt_ids[second_image.prompt_ids.index(image_id) - 1 :]
    ids = turn.token_ids + tail
    both = VisionBatch.of([first.vision]).pixel_values, second_image.vision.pixel_values
    from hone.types import VisionInputs

    vision = VisionInputs(
        pixel_values=torch.cat(both),
        image_grid_thw=torch.cat([first.vision.image_grid_thw, second_image.vision.image_grid_thw]),
        image_keys=first.vision.image_keys + second_image.vision.image_keys,
        tokens_per_image=first.vision.tokens_per_image + second_image.vision.tokens_per_image,
    )
    fed: list[int] = []

    def spy(_module: torch.nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        if kwargs.get("image_grid_thw") is not None:
            fed.append(int(kwargs["image_grid_thw"].shape[0]))

    handle = policy.model.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        [hit] = cached.generate([GenerationRequest("b", 0, ids, vision=vision)], params)
    finally:
        handle.remove()
    assert fed == [1]  # only the second image went through the vision tower
    [fresh] = sampler(policy, prefix_cache=False).generate(
        [GenerationRequest("b", 0, ids, vision=vision)], params
    )
    assert hit.token_ids == fresh.token_ids
    assert hit.sampler_logprobs == pytest.approx(fresh.sampler_logprobs, abs=1e-5)


def test_vision_tokens_are_never_sampled(policy: Policy) -> None:
    banned = set(vision_token_ids(policy.model.config))
    assert len(banned) == 4
    # Make the vision tokens the likeliest by far: a sampler that did not ban them would pick them.
    model = policy.model
    with torch.no_grad():
        saved = model.lm_head.weight[sorted(banned)].clone()
        model.lm_head.weight[sorted(banned)] *= 50
    try:
        rollouts = sampler(policy).generate(
            [ask(policy, "a", shapes(1))], SamplingParams(n=8, max_new_tokens=8)
        )
        trained, sampled = trainer_log_probs(policy, rollouts)
    finally:
        with torch.no_grad():
            model.lm_head.weight[sorted(banned)] = saved
    assert not banned & {t for r in rollouts for t in r.response_ids}
    assert torch.allclose(trained, sampled, atol=1e-5)


def test_vision_batch_selects_rows_with_their_patches(policy: Policy) -> None:
    requests = [
        ask(policy, "a", shapes(1)),
        ask(policy, "b", shapes(1, size=(56, 28))),
        ask(policy, "c", shapes(2)),
    ]
    visions = [r.vision for r in requests]
    batch = VisionBatch.of([visions[0], None, visions[1], visions[2]])
    assert batch is not None and batch.images_per_row.tolist() == [1, 0, 1, 1]
    picked = batch.select(torch.tensor([3, 1, 0]))
    assert picked.images_per_row.tolist() == [1, 0, 1]
    assert torch.equal(picked.pixel_values, torch.cat([visions[2].pixel_values, visions[0].pixel_values]))
    assert picked.image_grid_thw.tolist() == [[1, 4, 4], [1, 4, 4]]
    assert torch.equal(batch.select(slice(2, 3)).pixel_values, visions[1].pixel_values)


def test_lora_adapts_the_language_model_and_freeze_vision_freezes_the_tower(vl_dir: Path) -> None:
    lora = Policy.from_pretrained(vl_dir, lora=LoraSettings(r=4))
    adapted = {n for n, p in lora.model.named_parameters() if p.requires_grad}
    assert adapted and all("lora_" in n and "visual" not in n for n in adapted)
    assert any("language_model" in n for n in adapted)
    frozen = Policy.from_pretrained(vl_dir, freeze_vision=True)
    trainable = {n for n, p in frozen.model.named_parameters() if p.requires_grad}
    assert trainable and not any("visual" in n for n in trainable)
    assert any("visual" in n for n, _ in frozen.model.named_parameters())


def test_image_prompts_say_what_is_wrong(policy: Policy) -> None:
    two_parts = Sample(
        id="row-7",
        messages=[
            {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "?"}]}
        ],
        images=[shapes(1)],
    )
    with pytest.raises(ImagePromptError, match=r"row-7.*2 image placeholders for 1 images"):
        encode_prompt(two_parts, policy.tokenizer, True, None, policy.processor)
    marked = Sample(id="m", prompt="Look: <image> and <image>", images=[shapes(1)])
    with pytest.raises(ImagePromptError, match="2 <image> markers for 1 images"):
        encode_prompt(marked, policy.tokenizer, True, None, policy.processor)
    plain = Sample(id="p", prompt="How many?", images=[shapes(1)])
    with pytest.raises(ImagePromptError, match="chat_template is false"):
        encode_prompt(plain, policy.tokenizer, False, None, policy.processor)
    ids, vision = encode_prompt(plain, policy.tokenizer, True, None, policy.processor)
    assert vision is not None and ids.count(policy.model.config.image_token_id) == 4


def test_sft_trains_the_vision_tower_on_image_demonstrations(vl_dir: Path) -> None:
    from hone.training.sft import ImageExample, run_sft

    policy = Policy.from_pretrained(vl_dir)
    eos = policy.tokenizer.eos_token_id
    examples = []
    for k, (count, color) in enumerate([(1, "red"), (3, "blue"), (2, "green"), (4, "red")]):
        request = ask(policy, str(k), shapes(count, color))
        assert request.vision is not None
        answer = policy.tokenizer(str(count), add_special_tokens=False).input_ids
        examples.append(
            ImageExample([*request.prompt_ids, *answer, eos], len(request.prompt_ids), request.vision)
        )
    tower = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "visual" in n}
    rows: list[dict[str, float]] = []
    run_sft(
        policy, examples=examples, batch_size=4, lr=1e-2, max_steps=30, log=rows.append, schedule="constant"
    )
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    # The four prompts have the same ids (same text, same image size): only the images tell the answers apart.
    assert len({tuple(e.ids[: e.trained]) for e in examples if isinstance(e.trained, int)}) == 1
    assert losses[-1] < 0.5 * losses[0]
    moved = [n for n, p in policy.model.named_parameters() if "visual" in n and not torch.equal(p, tower[n])]
    assert moved  # the images' gradient reached the vision tower


@pytest.mark.system  # a fresh interpreter in a subprocess
def test_a_hub_name_loads_a_cached_vision_model_offline(tmp_path: Path, vl_dir: Path) -> None:
    """The hub path, as a real checkpoint takes it (no pretrained VLM can be downloaded here): a hub name
    resolved from the hub cache with HF_HUB_OFFLINE=1, the processor assembled without torchvision."""
    import os
    import shutil
    import subprocess
    import sys

    repo = tmp_path / "hub" / "models--hone-test--tiny-vl"
    shutil.copytree(vl_dir, repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    code = (
        "from hone.models import resolve_model; from hone.training.policy import Policy; "
        "p = Policy.from_pretrained(resolve_model('hone-test/tiny-vl')); "
        "print(type(p.model).__name__, type(p.processor).__name__, p.processor.image_token)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Qwen2_5_VLForConditionalGeneration Qwen2_5_VLProcessor <|image_pad|>" in done.stdout


def test_replay_with_a_vision_model_is_one_line_before_training(tmp_path: Path, vl_dir: Path) -> None:
    from hone.config import load_config
    from hone.rl.loop import train
    from hone.rl.replay import ReplayImagesError
    from tests.helpers import tiny_overrides

    overrides = {
        "data.task": "vlm_count",
        "data.task_args": "{kinds: [count]}",
        "algorithm.replay.enabled": "true",
    }
    with pytest.raises(ReplayImagesError, match=r"algorithm\.replay does not take a vision-language model"):
        train(load_config(None, tiny_overrides(tmp_path, vl_dir, "r", **overrides)))
    assert not (tmp_path / "r" / "checkpoints").exists()

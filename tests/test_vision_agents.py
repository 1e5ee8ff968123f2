"""Images as environment observations (issue 36, agents): multi-turn VLM episodes through the HF engine.

An environment's `reset`/`step` messages carry images as content parts (`{"type": "image", "image": ...}`);
the episode expands each through the model's processor, sends every turn's request with all the images so
far, and the rollout holds them in placeholder order, so the trainer recomputes exactly the sampler's
log-probs. Also: the prefix cache reuses turn 1's KV on turn 2 (only the new image goes through the vision
tower), a text-only model refuses an image in one line, verifiers' `image_url` parts become images, and the
`zoom_digit` example game.
"""

from __future__ import annotations

import base64
import contextlib
import io
from typing import Any

import pytest
import torch
from PIL import Image

from hone.data.images import load_image, take_images
from hone.envs import Environment, Message, PlayingEnvironment, StepResult, ZoomDigit, make_env
from hone.envs.base import Chat
from hone.envs.games.zoom import crop_box
from hone.models.vision import encode_images
from hone.rollout.engines.hf import HFSampler
from hone.rollout.multiturn import EpisodeLimits, demonstration_tokens, run_episodes
from hone.rollout.trajectory import ImageObservationError
from hone.training.collate import collate
from hone.training.policy import Policy
from hone.types import Rollout, Sample, SamplingParams
from tests.helpers import Scripted, shapes


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Policy:
    from hone.models.tiny_vl import build_tiny_vl_model

    return Policy.from_pretrained(build_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl") / "m"))


FIRST, SECOND = shapes(2), shapes(3, "blue", (56, 28))  # other grids: 4x4 and 2x4 patches


class TwoLooks(Environment):
    """Opens with the sample's own messages (its image fills the placeholder), answers turn 1 with a
    second image (as a user turn of parts), ends after turn 2."""

    max_turns = 3

    def reset(self, sample: Sample) -> list[Message]:
        self.turns = 0
        return [dict(m) for m in sample.messages or []]

    def step(self, assistant_message: str) -> StepResult:
        self.turns += 1
        if self.turns == 2:
            return StepResult([], reward=1.0, done=True)
        look = [{"type": "text", "text": "Closer:"}, {"type": "image", "image": SECOND}]
        return StepResult([{"role": "user", "content": look}])


def image_sample(sample_id: str = "s") -> Sample:
    parts = [{"type": "image"}, {"type": "text", "text": "How many?"}]
    return Sample(id=sample_id, messages=[{"role": "user", "content": parts}], images=[FIRST])


LIMITS = EpisodeLimits(max_turns=3, max_tokens_per_turn=6, max_total_tokens=512)


def play(policy: Policy, sampler: Any, params: SamplingParams, samples: list[Sample]) -> list[Rollout]:
    return run_episodes(sampler, policy.tokenizer, TwoLooks, samples, params, LIMITS, policy.processor)


def test_an_image_observation_episode_is_trained_on_exactly_what_was_sampled(policy: Policy) -> None:
    params = SamplingParams(n=2, max_new_tokens=6, seed=0)
    rollouts = play(
        policy, HFSampler(policy.model, policy.tokenizer), params, [image_sample("a"), image_sample("b")]
    )
    assert len(rollouts) == 4 and all(len(r.turns) == 2 for r in rollouts)
    image_id = policy.model.config.image_token_id
    alone = [encode_images(policy.processor, "<|image_pad|>", [image])[1] for image in (FIRST, SECOND)]
    for r in rollouts:
        vision = r.vision
        # both images, in the order of their placeholders: the sample's, then the observation's
        assert vision is not None and vision.image_keys == alone[0].image_keys + alone[1].image_keys
        assert vision.image_grid_thw.tolist() == [[1, 4, 4], [1, 2, 4]] and vision.tokens_per_image == (4, 2)
        assert torch.equal(vision.pixel_values, torch.cat([alone[0].pixel_values, alone[1].pixel_values]))
        assert r.token_ids.count(image_id) == 6
        # the second image's tokens are in the response, never trained on; exactly the sampled turns are
        response, mask = r.response_ids, r.loss_mask
        assert [t for t, m in zip(response, mask, strict=True) if t == image_id] == [image_id] * 2
        assert all(m == 0 for t, m in zip(response, mask, strict=True) if t == image_id)
        assert [i for i, m in enumerate(mask) if m] == [i for a, b in r.turns for i in range(a, b)]
        assert r.messages is not None and r.messages[-2]["content"][1] == {"type": "image"}  # recorded bare
    batch = collate(rollouts, pad_id=policy.tokenizer.pad_token_id)
    assert batch.vision is not None and batch.vision.images_per_row.tolist() == [2, 2, 2, 2]
    with torch.no_grad():
        trained, _ = policy.token_log_probs(batch.input_ids, batch.attention_mask, vision=batch.vision)
    trained, sampled = trained * batch.response_mask, batch.sampler_log_probs * batch.response_mask
    assert sampled.abs().sum() > 0 and int(batch.response_mask.sum()) == sum(
        sum(r.loss_mask) for r in rollouts
    )
    assert torch.allclose(trained, sampled, atol=1e-5), (trained - sampled).abs().max()


def test_turn_two_reuses_turn_ones_cache_and_feeds_only_the_new_image(policy: Policy) -> None:
    fed: list[int] = []

    def spy(_module: torch.nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        if kwargs.get("image_grid_thw") is not None:
            fed.append(int(kwargs["image_grid_thw"].shape[0]))

    params = SamplingParams(max_new_tokens=6, temperature=0)
    runs = []
    for cached in (True, False):
        fed.clear()
        handle = policy.model.register_forward_pre_hook(spy, with_kwargs=True)
        try:
            [r] = play(
                policy,
                HFSampler(policy.model, policy.tokenizer, prefix_cache=cached),
                params,
                [image_sample()],
            )
        finally:
            handle.remove()
        runs.append((r, list(fed)))
    (hit, fed_cached), (fresh, fed_fresh) = runs
    assert fed_cached == [1, 1]  # turn 1: the sample's image; turn 2: only the observation's
    assert fed_fresh == [1, 2]  # without the cache, turn 2 prefills both
    assert hit.token_ids == fresh.token_ids
    assert hit.sampler_logprobs == pytest.approx(fresh.sampler_logprobs, abs=1e-5)


def test_a_text_only_model_refuses_an_image_in_one_line(policy: Policy) -> None:
    text_only = Scripted(policy.tokenizer, ["look", "done"])  # the same tokenizer, no processor
    text_sample = Sample(id="t", messages=[{"role": "user", "content": "Look."}])
    for sample, where in [(text_sample, "the observation after turn 1"), (image_sample("i"), "the opening")]:
        with pytest.raises(ImageObservationError) as info:
            run_episodes(text_only, policy.tokenizer, TwoLooks, [sample], SamplingParams(), LIMITS)
        message = str(info.value)
        assert "\n" not in message and "text-only" in message and where in message and sample.id in message


class ShowsAndSwallows(PlayingEnvironment):
    """Plays itself, sends an image, and catches every `Exception` of its own code (as verifiers does)."""

    async def play(self, sample: Sample, chat: Chat) -> StepResult:
        with contextlib.suppress(Exception):
            await chat([{"role": "user", "content": [{"type": "image", "image": FIRST}]}], {})
        return StepResult([], done=True)


def test_a_text_only_model_stops_the_run_even_out_of_an_environments_own_play(policy: Policy) -> None:
    sample = Sample(id="p", prompt="x")
    with pytest.raises(ImageObservationError, match=r"sample 'p': the opening messages .*text-only"):
        run_episodes(
            Scripted(policy.tokenizer, ["a"]),
            policy.tokenizer,
            ShowsAndSwallows,
            [sample],
            SamplingParams(),
            LIMITS,
        )


def test_sft_demonstrations_with_images_are_refused_not_rendered_without_pixels(policy: Policy) -> None:
    messages = [*image_sample().messages, {"role": "assistant", "content": "2"}]  # type: ignore[misc]
    with pytest.raises(ImageObservationError, match="demonstrations with images"):
        demonstration_tokens(policy.tokenizer, messages)


def test_the_zoom_game_answers_a_crop_with_an_enlarged_image() -> None:
    env = make_env("zoom_digit")()
    assert isinstance(env, ZoomDigit)
    train, held_out = ZoomDigit.make_samples(20, 0, "train"), ZoomDigit.make_samples(5, 0, "eval")
    keys = {(s.meta["digit"], s.meta["x"], s.meta["y"]) for s in train}
    assert len(train) == 20 and not keys & {(s.meta["digit"], s.meta["x"], s.meta["y"]) for s in held_out}
    sample = train[0]
    [opening] = env.reset(sample)
    whole = opening["content"][0]["image"]
    assert opening["content"][0]["type"] == "image" and whole.size == (112, 112)
    x, y = sample.meta["x"], sample.meta["y"]
    zoomed = env.step(f"crop {x} {y}")
    [part, text] = zoomed.messages[0]["content"]
    assert part["image"].size == (56, 56) and not zoomed.done and zoomed.info == {"crops": 1.0}

    def dark(image: Image.Image) -> int:
        return sum(1 for p in image.getdata() if sum(p) < 300)

    # the digit's pixels, each enlarged 2x2 (nearest): 4x as many dark pixels as in the cropped region
    assert dark(part["image"]) == 4 * dark(whole.crop(crop_box(x, y, 28, 112))) > 0
    assert "Pixels" in text["text"]
    assert env.step("hmm").messages[0]["content"].startswith("Reply")
    wrong = (int(sample.answer or 0) + 1) % 10
    assert env.step(f"answer {wrong}").reward == 0.0
    assert env.step(f"answer {sample.answer}").reward == 1.0


def test_the_zoom_game_plays_on_the_tiny_vlm(policy: Policy) -> None:
    samples = ZoomDigit.make_samples(2, 0, "train")
    limits = EpisodeLimits(max_turns=2, max_tokens_per_turn=4, max_total_tokens=512)
    rollouts = run_episodes(
        HFSampler(policy.model, policy.tokenizer),
        policy.tokenizer,
        make_env("zoom_digit"),
        samples,
        SamplingParams(max_new_tokens=4, seed=0),
        limits,
        policy.processor,
    )
    # The whole canvas is shrunk to 56x56 by the processor: one image of 4 tokens, whatever was replied.
    assert all(r.vision is not None and r.vision.tokens_per_image[0] == 4 for r in rollouts)


def png_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_openai_image_url_parts_become_images() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "A"},
                {"type": "image_url", "image_url": {"url": png_url(FIRST)}},
            ],
        }
    ]
    bare, [image] = take_images(messages, "here")
    assert bare[0]["content"] == [{"type": "text", "text": "A"}, {"type": "image"}]
    assert list(load_image(image).getdata()) == list(FIRST.getdata())


def test_a_verifiers_image_url_part_reaches_the_model(policy: Policy) -> None:
    pytest.importorskip("verifiers.v1")
    import verifiers.v1 as vf

    from hone.envs.verifiers_env import _to_hone

    url = png_url(FIRST)
    message = vf.UserMessage(
        content=[
            vf.types.TextContentPart(text="Q"),
            vf.types.ImageUrlContentPart(image_url=vf.types.ImageUrlSource(url=url)),
        ]
    )
    out = _to_hone(message, "t")
    assert out["role"] == "user" and out["content"][0] == {"type": "text", "text": "Q"}
    assert list(load_image(out["content"][1]["image"]).getdata()) == list(FIRST.getdata())
    # A taskset whose prompt holds an image: the sample keeps it as a data file's, and an episode plays it.
    make = make_env("verifiers:tests.vf_envs_for_tests", {"n": 8, "image": True, "image_url": url})
    [sample] = type(make()).make_samples(1, 0, "train")
    assert sample.images is not None and len(sample.images) == 1
    assert {"type": "image"} in sample.messages[-1]["content"]  # type: ignore[index]
    limits = EpisodeLimits(max_turns=1, max_tokens_per_turn=4, max_total_tokens=256)
    sampler = HFSampler(policy.model, policy.tokenizer)
    [r] = run_episodes(
        sampler,
        policy.tokenizer,
        make,
        [sample],
        SamplingParams(max_new_tokens=4, seed=0),
        limits,
        policy.processor,
    )
    assert r.metrics["env/errors"] == 0.0 and r.vision is not None and r.vision.num_images == 1

"""The built-in vision game `zoom_digit`: find a small digit in an image by zooming in (MGPO-style crops).

An example of an environment whose observations are images (a vision-language model plays it; see
`hone.rollout.multiturn`): an image is a content part `{"type": "image", "image": <PIL image>}` of a
message, beside text parts. The first message shows the whole canvas, where the digit is a few pixels
tall: once the model's processor has shrunk it (to at most 56x56 on `tiny-vl`), it cannot be read. The
action `crop X Y` answers with the `crop`-pixel square around (X, Y), enlarged to `zoom` pixels, as a new
image (Multi-turn Grounding-based Policy Optimization, Huang et al. 2025: the model grounds, the
environment crops); `answer D` ends the episode, reward 1.0 when D is the digit. A reply that is
neither gets a reminder and uses a turn.

See `hone.envs.games` for all the games.
"""

from __future__ import annotations

import random
import re
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from hone.envs.base import Environment, Message, StepResult, register_env
from hone.envs.games.common import draw
from hone.types import Sample

_CROP = re.compile(r"crop\s+(-?\d+)\s*,?\s*(-?\d+)", re.IGNORECASE)
_ANSWER = re.compile(r"answer\s*:?\s*(\d)", re.IGNORECASE)
_HELP = "Reply `crop X Y` to zoom in around pixel (X, Y), or `answer D` with the digit."


def canvas(digit: int, x: int, y: int, size: int, height: int = 8) -> Image.Image:
    """A white `size`x`size` image with `digit` drawn in black, `height` pixels tall, centred on (x, y)."""
    image = Image.new("RGB", (size, size), "white")
    font = ImageFont.load_default(size=height)
    ImageDraw.Draw(image).text((x, y), str(digit), fill="black", font=font, anchor="mm")
    return image


def crop_box(x: int, y: int, crop: int, size: int) -> tuple[int, int, int, int]:
    """The `crop`-pixel square centred on (x, y), moved inside the `size`x`size` canvas."""
    left = min(max(x - crop // 2, 0), size - crop)
    top = min(max(y - crop // 2, 0), size - crop)
    return left, top, left + crop, top + crop


@register_env("zoom_digit")
class ZoomDigit(Environment):
    """Read a tiny digit on a `size`x`size` canvas by cropping (module docstring). Observations are image
    messages; reward 1.0 for the right `answer D`, 0 otherwise. `info`: `crops` (how many were asked),
    `solved`."""

    max_turns = 4

    def __init__(self, size: int = 112, crop: int = 28, zoom: int = 56, digit_px: int = 8) -> None:
        if not 0 < crop <= size:
            raise ValueError(f"crop must be in 1..size ({size}), got {crop}")
        if zoom < 1 or digit_px < 1:
            raise ValueError(f"zoom and digit_px must be >= 1, got {zoom} and {digit_px}")
        self.size, self.crop, self.zoom, self.digit_px = size, crop, zoom, digit_px
        self.image: Image.Image | None = None
        self.digit = -1

    @classmethod
    def make_samples(
        cls, n: int, seed: int, split: str, size: int = 112, digit_px: int = 8, **args: Any
    ) -> list[Sample]:
        """A digit 0-9 at a random spot (away from the border); split by (digit, spot)."""
        margin = digit_px

        def make(rng: random.Random) -> tuple[str, Sample]:
            digit = rng.randrange(10)
            x, y = rng.randint(margin, size - margin), rng.randint(margin, size - margin)
            meta = {"digit": digit, "x": x, "y": y, "size": size, "digit_px": digit_px}
            return f"{digit}/{x}/{y}/{size}", Sample(id="", prompt=_HELP, answer=str(digit), meta=meta)

        return draw("zoom_digit", n, seed, split, make)

    def reset(self, sample: Sample) -> list[Message]:
        meta = sample.meta
        self.size = int(meta.get("size", self.size))
        self.digit_px = int(meta.get("digit_px", self.digit_px))
        self.digit = int(meta["digit"])
        self.image = canvas(self.digit, int(meta["x"]), int(meta["y"]), self.size, self.digit_px)
        text = f"A digit is hidden in this {self.size}x{self.size} image. {_HELP}"
        return [_image_turn(self.image, text)]

    def step(self, assistant_message: str) -> StepResult:
        assert self.image is not None, "step before reset"
        answer = _ANSWER.search(assistant_message)
        if answer is not None:
            solved = int(answer.group(1)) == self.digit
            return StepResult([], reward=float(solved), done=True, info={"solved": float(solved)})
        crop = _CROP.search(assistant_message)
        if crop is None:
            return StepResult([{"role": "user", "content": _HELP}], info={"invalid": 1.0})
        box = crop_box(int(crop.group(1)), int(crop.group(2)), min(self.crop, self.size), self.size)
        zoomed = self.image.crop(box).resize((self.zoom, self.zoom), Image.Resampling.NEAREST)
        text = f"Pixels {box[0]}..{box[2]} x {box[1]}..{box[3]}, enlarged. {_HELP}"
        return StepResult([_image_turn(zoomed, text)], info={"crops": 1.0})


def _image_turn(image: Image.Image, text: str) -> Message:
    return {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}

"""`vlm_count`: a generated vision-language task (recipe `vlm-count`) — questions about drawn shapes.

Why generated: like the text tasks, it needs no download and is verifiable exactly, so the whole VLM RL
loop (images through the processor, rollouts, rewards) can be tested offline on a tiny model. Each problem
draws 1..`max_count` squares, circles and triangles in a few saturated colours on a grey `size`x`size`
canvas, spaced apart so they never touch (each shape is one connected blob a test can count), and asks:

- "count": how many shapes → a digit;
- "compare": only red and blue shapes, in different numbers; which colour has more → "red" / "blue";
- "color": one shape; its colour → "red" / "blue" / "green".

The train/eval split hashes the drawn scene (shapes, colours, positions, sizes), not the question text:
the question is one of three strings, so it cannot tell two images apart, and an eval image must never be
trained on.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from PIL import Image, ImageDraw

from hone.data.tasks import Task, first_line, register_task
from hone.types import Sample

# Far apart in RGB, so a small vision tower separates them at 56 px and a test can classify pixels.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "blue": (30, 60, 220),
    "green": (30, 160, 60),
}
SHAPES = ("square", "circle", "triangle")
KINDS = ("count", "compare", "color")
QUESTIONS = {
    # Short: the tiny model's tokenizer spends a token per character, and the prompt is most of a row.
    "count": "How many shapes?",
    "compare": "More red or blue shapes?",
    "color": "What color is the shape?",
}
BACKGROUND = (122, 116, 104)  # CLIP's mean colour: the processor normalises it to ~0, so a ViT patch of
# background embeds to ~0 and a shape's patch stands out (on white, 3 of 4 tokens carried a constant)
_GAP = 2  # pixels between the boxes of two shapes: they never touch, so each is one blob
_PLACEMENT_TRIES = 200  # per shape, before the whole scene is drawn again
_SCENE_TRIES = 200  # whole scenes at the smallest shapes before max_count is declared too many for size


@dataclass(frozen=True)
class Shape:
    """One drawn shape: its kind, colour name, and centre and half-size in pixels (its box is
    `[x - r, x + r] x [y - r, y + r]`)."""

    kind: str
    color: str
    x: int
    y: int
    r: int


def draw(shapes: Sequence[Shape], size: int) -> Image.Image:
    """The scene as an RGB image: the shapes filled in their colours on `BACKGROUND` (no anti-aliasing, so
    pixels are exactly the background or a shape's colour)."""
    image = Image.new("RGB", (size, size), BACKGROUND)
    pen = ImageDraw.Draw(image)
    for s in shapes:
        fill = COLORS[s.color]
        box = (s.x - s.r, s.y - s.r, s.x + s.r, s.y + s.r)
        if s.kind == "square":
            pen.rectangle(box, fill=fill)
        elif s.kind == "circle":
            pen.ellipse(box, fill=fill)
        else:  # triangle: apex up, base on the box's bottom edge
            pen.polygon([(s.x, s.y - s.r), (s.x - s.r, s.y + s.r), (s.x + s.r, s.y + s.r)], fill=fill)
    return image


@register_task("vlm_count")
class VlmCount(Task):
    """Questions about 1..`max_count` shapes drawn on a `size`x`size` canvas (module docstring); `kinds`
    picks the question kinds (default all three), each problem's drawn uniformly among them.

    `Sample.messages` is one user turn, the image placeholder then the question; `Sample.images` holds the
    drawn PIL image; `meta` holds `kind`, `shapes` (the scene), `counts` (shapes per colour) and `total`.
    Graded on the response's first line, case-insensitive."""

    def __init__(self, max_count: int = 4, size: int = 56, kinds: Sequence[str] | None = None) -> None:
        if not 1 <= max_count <= 9:  # the count answer is one digit
            raise ValueError(f"max_count must be in 1..9, got {max_count}")
        if size < 24:
            raise ValueError(f"size must be >= 24 pixels (shapes must stay visible), got {size}")
        chosen = tuple(KINDS if kinds is None else ([kinds] if isinstance(kinds, str) else kinds))
        if not chosen or set(chosen) - set(KINDS):
            raise ValueError(f"kinds must be a non-empty list of {list(KINDS)}, got {kinds!r}")
        self.max_count, self.size, self.kinds = max_count, size, chosen
        # Half-sizes scale with the canvas: 5..8 px at 56 px (10..16 px shapes), visible after the
        # processor's patching; smaller when many shapes must fit (see `_place`).
        self.r_min, self.r_max = max(3, size * 5 // 56), max(4, size * 8 // 56)

    # Text tasks grade a digit; a VLM's answers are words too: case does not matter.
    def reward(self, response_text: str, sample: Sample) -> float:
        return float(first_line(response_text).lower() == (sample.answer or "").strip().lower())

    def demonstration(self, sample: Sample) -> str:
        return sample.answer or ""

    def _split_key(self, sample: Sample) -> str:
        return json.dumps({"kind": sample.meta["kind"], "size": self.size, "shapes": sample.meta["shapes"]})

    def _make(self, rng: random.Random) -> Sample:
        kind = rng.choice(self.kinds)
        colors = self._colors(kind, rng)
        shapes = self._place(colors, rng)
        counts = {c: colors.count(c) for c in COLORS}
        answer = {
            "count": str(len(shapes)),
            "compare": "red" if counts["red"] > counts["blue"] else "blue",
            "color": colors[0],
        }[kind]
        return Sample(
            id="",
            messages=[
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTIONS[kind]}]}
            ],
            images=[draw(shapes, self.size)],
            answer=answer,
            meta={
                "kind": kind,
                "shapes": [asdict(s) for s in shapes],
                "counts": counts,
                "total": len(shapes),
            },
        )

    def _colors(self, kind: str, rng: random.Random) -> list[str]:
        """The colour of each shape to draw; their number is the scene's shape count."""
        if kind == "color":
            return [rng.choice(list(COLORS))]
        if kind == "count":
            return [rng.choice(list(COLORS)) for _ in range(rng.randint(1, self.max_count))]
        # compare: red and blue in different numbers (one may be none), at most max_count in all.
        pairs = [(a, b) for a in range(self.max_count + 1) for b in range(self.max_count + 1 - a) if a != b]
        red, blue = rng.choice(pairs)
        colors = ["red"] * red + ["blue"] * blue
        rng.shuffle(colors)
        return colors

    def _place(self, colors: list[str], rng: random.Random) -> list[Shape]:
        """Shapes at random positions whose boxes (plus `_GAP`) do not overlap, drawn from `rng` alone. A
        scene that does not fit is drawn again, smaller shapes allowed after failed tries."""
        r_max = self.r_max
        for _ in range(self.r_max - self.r_min + _SCENE_TRIES):
            shapes: list[Shape] = []
            for color in colors:
                shape = self._fit(color, shapes, r_max, rng)
                if shape is None:
                    break
                shapes.append(shape)
            if len(shapes) == len(colors):
                return shapes
            r_max = max(self.r_min, r_max - 1)
        raise ValueError(
            f"task 'vlm_count': {len(colors)} shapes do not fit apart on a {self.size}px canvas; "
            "lower max_count or raise size"
        )

    def _fit(self, color: str, placed: list[Shape], r_max: int, rng: random.Random) -> Shape | None:
        kind = rng.choice(SHAPES)
        for _ in range(_PLACEMENT_TRIES):
            r = rng.randint(self.r_min, r_max)
            x, y = rng.randint(r, self.size - 1 - r), rng.randint(r, self.size - 1 - r)
            if all(max(abs(x - p.x), abs(y - p.y)) > r + p.r + _GAP for p in placed):
                return Shape(kind, color, x, y, r)
        return None


def scene(sample: Sample) -> list[Shape]:
    """A `vlm_count` sample's shapes, from its `meta`."""
    shapes: list[dict[str, Any]] = sample.meta["shapes"]
    return [Shape(**s) for s in shapes]


__all__ = ["BACKGROUND", "COLORS", "KINDS", "QUESTIONS", "SHAPES", "Shape", "VlmCount", "draw", "scene"]

"""The `vlm_count` generated task: deterministic scenes, a split by scene, answers the pixels bear out."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from hone.data import HoneDataError, get_task, load_samples
from hone.data.images import image_parts, load_image
from hone.data.tasks import TASKS
from hone.data.vision_tasks import BACKGROUND, COLORS, KINDS, VlmCount, draw, scene
from hone.types import Sample
from tests.helpers import write_jsonl


def blobs(image: Image.Image) -> list[tuple[str, int]]:
    """The image's connected non-background regions (4-neighbour flood fill), each as (colour name, pixels):
    read off the pixels alone, so it checks the drawing, not the meta the task wrote beside it."""
    width, height = image.size
    pixels = image.load()
    assert pixels is not None
    names: dict[object, str] = {rgb: name for name, rgb in COLORS.items()}
    seen: set[tuple[int, int]] = set()
    found: list[tuple[str, int]] = []
    for start in ((x, y) for y in range(height) for x in range(width)):
        if start in seen or pixels[start] == BACKGROUND:
            continue
        colors: Counter[str] = Counter()
        stack = [start]
        seen.add(start)
        while stack:
            x, y = stack.pop()
            colors[names[pixels[x, y]]] += 1  # KeyError: a pixel neither background nor a palette colour
            for nx, ny in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                inside = 0 <= nx < width and 0 <= ny < height
                if inside and (nx, ny) not in seen and pixels[nx, ny] != BACKGROUND:
                    seen.add((nx, ny))
                    stack.append((nx, ny))
        assert len(colors) == 1, "two shapes touch"
        found.append((next(iter(colors)), sum(colors.values())))
    return found


def test_registered_and_built_with_options() -> None:
    assert TASKS["vlm_count"] is VlmCount
    task = get_task("vlm_count", max_count=2, size=40, kinds=["count"])
    assert isinstance(task, VlmCount) and (task.max_count, task.size, task.kinds) == (2, 40, ("count",))
    bad_options: list[dict[str, Any]] = [
        {"max_count": 0},
        {"max_count": 10},
        {"size": 8},
        {"kinds": []},
        {"kinds": ["shape"]},
    ]
    for bad in bad_options:
        with pytest.raises(ValueError):
            VlmCount(**bad)


def test_same_seed_same_scenes_other_seed_other_scenes() -> None:
    task = VlmCount()
    a, b, c = task.train_samples(30, seed=1), task.train_samples(30, seed=1), task.train_samples(30, seed=2)
    assert [(s.meta, s.answer, s.messages) for s in a] == [(s.meta, s.answer, s.messages) for s in b]
    assert all(
        x.images and y.images and x.images[0].tobytes() == y.images[0].tobytes()
        for x, y in zip(a, b, strict=True)
    )
    assert [s.meta["shapes"] for s in a] != [s.meta["shapes"] for s in c]


def test_train_and_eval_scenes_are_disjoint_by_split_key() -> None:
    task = VlmCount(max_count=2, kinds=["color"])  # a small space: collisions would show
    train = task.train_samples(2000, seed=0)
    evals = task.eval_samples(200)
    train_keys = {task._split_key(s) for s in train}
    eval_keys = [task._split_key(s) for s in evals]
    assert len(set(eval_keys)) == 200 and not train_keys & set(eval_keys)
    assert not {s.images[0].tobytes() for s in train if s.images} & {
        s.images[0].tobytes() for s in evals if s.images
    }
    # The key is the scene: a moved shape is another problem, though question and answer are the same.
    moved = Sample(id="", messages=evals[0].messages, answer=evals[0].answer, meta={**evals[0].meta})
    moved.meta["shapes"] = [{**evals[0].meta["shapes"][0], "x": evals[0].meta["shapes"][0]["x"] + 1}]
    assert task._split_key(moved) != task._split_key(evals[0])


def test_images_are_size_by_size_rgb_and_every_answer_matches_the_pixels() -> None:
    task = VlmCount()
    samples = task.train_samples(300, seed=5)
    assert set(Counter(s.meta["kind"] for s in samples)) == set(KINDS)
    for s in samples:
        assert s.images and len(s.images) == 1 and s.messages
        image = s.images[0]
        assert (image.mode, image.size) == ("RGB", (56, 56))
        assert s.messages[0]["content"][0] == {"type": "image"} and image_parts(s.messages) == 1
        found = blobs(image)
        colors = Counter(color for color, _ in found)
        assert min(pixels for _, pixels in found) >= 20  # visible: no shape is a speck at 56 px
        assert len(found) == s.meta["total"] == len(scene(s)) and dict(colors) == {
            k: v for k, v in s.meta["counts"].items() if v
        }
        if s.meta["kind"] == "count":
            assert s.answer == str(len(found)) and 1 <= len(found) <= 4
        elif s.meta["kind"] == "compare":
            assert set(colors) <= {"red", "blue"} and colors["red"] != colors["blue"]
            assert s.answer == ("red" if colors["red"] > colors["blue"] else "blue")
        else:
            assert len(found) == 1 and s.answer == found[0][0]


def test_max_count_and_size_are_honoured() -> None:
    task = VlmCount(max_count=9, size=80, kinds=["count"])
    samples = task.train_samples(200, seed=0)
    totals = {len(blobs(s.images[0])) for s in samples if s.images}
    assert totals == set(range(1, 10))
    assert {s.images[0].size for s in samples if s.images} == {(80, 80)}


def test_reward_and_demonstration() -> None:
    task = VlmCount()
    count = next(s for s in task.train_samples(50, seed=0) if s.meta["kind"] == "count")
    color = next(s for s in task.train_samples(50, seed=0) if s.meta["kind"] == "color")
    assert task.reward(task.demonstration(count), count) == 1.0
    assert task.reward(f" {count.answer}\nbecause I counted", count) == 1.0  # first line, stripped
    assert task.reward(str(int(count.answer or "0") + 1), count) == 0.0
    assert task.reward(f"{count.answer} shapes", count) == 0.0
    assert task.reward((color.answer or "").upper(), color) == 1.0  # case-insensitive
    wrong = next(c for c in COLORS if c != color.answer)
    assert task.reward(wrong, color) == 0.0 and task.reward("", color) == 0.0


def test_draw_is_a_function_of_the_scene() -> None:
    sample = VlmCount().train_samples(1, seed=3)[0]
    assert sample.images and draw(scene(sample), 56).tobytes() == sample.images[0].tobytes()


def test_task_samples_pass_the_data_checks(tmp_path: Path) -> None:
    """Saved as a dataset file (PNG files named by an image column), the task's problems load back through
    `load_samples`' checks with the same messages, answers and pixels."""
    samples = VlmCount().train_samples(12, seed=4)
    rows: list[dict[str, Any]] = []
    for i, s in enumerate(samples):
        assert s.images
        s.images[0].save(tmp_path / f"{i}.png")
        rows.append({"prompt": s.messages, "image": f"{i}.png", "answer": s.answer})
    loaded = load_samples(str(write_jsonl(tmp_path / "vl.jsonl", rows)), image_field="image")
    for s, back in zip(samples, loaded, strict=True):
        assert (back.messages, back.answer) == (s.messages, s.answer)
        assert back.images and s.images and load_image(back.images[0]).tobytes() == s.images[0].tobytes()
    # An extra image for the one placeholder is refused, naming the row.
    rows[3]["image"] = ["0.png", "1.png"]
    with pytest.raises(HoneDataError, match=r"vl\.jsonl line 4: field 'image' has 2 image\(s\) for 1"):
        load_samples(str(write_jsonl(tmp_path / "vl.jsonl", rows)), image_field="image")

"""Images in prompt data (`data.image_field`, image content parts): resolved and header-checked when rows
are read, decoded by `load_image` only when a prompt is encoded; bad input is one line naming the row."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from hone.data import HoneDataError, load_samples
from hone.data.images import fill_images, image_parts, image_refs, load_image, resolve_image
from hone.data.splits import problem_key
from hone.types import Sample
from tests.helpers import write_jsonl

ASK = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What color?"}]}]


def png(path: Path, color: str, size: tuple[int, int] = (6, 4), mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return path


def png_bytes(color: str, size: tuple[int, int] = (5, 5)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def test_relative_paths_resolve_against_the_data_file_and_decode_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    png(tmp_path / "data" / "img" / "r.png", "red")
    png(tmp_path / "data" / "img" / "b.png", "blue", mode="P")  # palette: load_image gives RGB
    rows = [
        {"prompt": ASK, "image": "img/r.png", "answer": "red"},  # TRL conversational
        {"prompt": "Which colors?", "image": ["img/b.png", "img/r.png"], "answer": "blue red"},
        {"prompt": "No image.", "image": None, "answer": "x"},
    ]
    path = write_jsonl(tmp_path / "data" / "d.jsonl", rows)
    monkeypatch.chdir(tmp_path)  # relative to the file's directory, not the working directory
    first, second, third = load_samples(str(path), image_field="image")
    assert first.images == [str(tmp_path / "data" / "img" / "r.png")]
    assert first.messages == ASK and first.meta == {}  # the image column is not copied into meta
    assert second.images == [str(tmp_path / "data" / "img" / n) for n in ("b.png", "r.png")]
    assert third.images is None  # None, as a text-only sample always had
    image = load_image(second.images[0])
    assert (image.mode, image.size, image.getpixel((0, 0))) == ("RGB", (6, 4), (0, 0, 255))


def test_image_parts_carrying_their_own_image_fill_in_order(tmp_path: Path) -> None:
    png(tmp_path / "a.png", "red")
    png(tmp_path / "b.png", "blue")
    content = [
        {"type": "image", "image": "a.png"},
        {"type": "text", "text": "and"},
        {"type": "image"},  # filled from the image field
        {"type": "image", "path": "a.png"},
    ]
    row = {"messages": [{"role": "user", "content": content}], "pic": "b.png", "answer": "x"}
    sample = load_samples(
        str(write_jsonl(tmp_path / "d.jsonl", [row])), messages_field="messages", image_field="pic"
    )[0]
    assert sample.images == [str(tmp_path / n) for n in ("a.png", "b.png", "a.png")]
    parts = sample.messages[0]["content"] if sample.messages else []
    # The references moved to Sample.images; the template sees bare placeholders.
    assert parts == [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}, {"type": "image"}]
    assert image_parts(sample.messages or []) == 3
    # Without an image field, parts that carry their images are enough.
    row = {"prompt": [{"role": "user", "content": [content[0], content[1]]}], "answer": "x"}
    assert load_samples(str(write_jsonl(tmp_path / "e.jsonl", [row])))[0].images == [str(tmp_path / "a.png")]


def test_parquet_image_column_with_bytes_or_paths_and_saved_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    data = tmp_path / "data"
    png(data / "g.png", "green")
    blue = png_bytes("blue")
    rows = {
        "messages": [ASK, ASK],
        "image": [{"bytes": blue, "path": None}, {"bytes": None, "path": "g.png"}],
        "answer": ["blue", "green"],
    }
    monkeypatch.chdir(data)  # `datasets` reads a path-only image relative to the working directory
    ds = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    ds.to_parquet(str(data / "d.parquet"))  # keeps the path-only image as its (relative) path
    ds.save_to_disk(str(data / "saved"))
    monkeypatch.chdir(tmp_path)  # Hone resolves it against the parquet file's directory instead
    fields: dict[str, Any] = {"messages_field": "messages", "image_field": "image"}
    embedded, by_path = load_samples(str(data / "d.parquet"), **fields)
    assert embedded.images == [blue] and by_path.images == [str(data / "g.png")]
    # Arrow gives every part every key (a text part's `image: None`): dropped again.
    assert embedded.messages == ASK and by_path.messages == ASK
    assert load_image(by_path.images[0]).getpixel((0, 0)) == (0, 128, 0)
    saved = load_samples(str(data / "saved"), **fields)  # a saved dataset's rows come decoded: PIL images
    assert all(isinstance(s.images[0], Image.Image) for s in saved if s.images)
    assert [load_image(s.images[0]).getpixel((1, 1)) for s in saved if s.images] == [(0, 0, 255), (0, 128, 0)]
    assert [s.messages for s in saved] == [ASK, ASK]


def test_resolve_and_load_accept_every_reference_kind(tmp_path: Path) -> None:
    path = png(tmp_path / "r.png", "red")
    pil = Image.new("L", (3, 3), 200)
    for ref, kept in [
        (pil, pil),
        (str(path), str(path)),
        (path, str(path)),
        (path.read_bytes(), path.read_bytes()),
        ({"bytes": path.read_bytes(), "path": "elsewhere.png"}, path.read_bytes()),
        ({"bytes": None, "path": "r.png"}, str(path)),
    ]:
        assert resolve_image(ref, tmp_path, "here") == kept
        assert load_image(ref if not isinstance(ref, dict) or ref["bytes"] else kept).mode == "RGB"
    assert image_refs(None, tmp_path, "here") == []


def test_image_counts_are_part_of_the_problem_key(tmp_path: Path) -> None:
    a, b = png(tmp_path / "a.png", "red"), png(tmp_path / "b.png", "blue")
    one = Sample(id="1", messages=ASK, answer="red", images=[str(a)])
    other = Sample(id="2", messages=ASK, answer="red", images=[str(b)])
    text = Sample(id="3", prompt="q", answer="a")
    assert problem_key(one) != problem_key(other)  # same question, another picture: another problem
    assert problem_key(text) == ("q", None, "a")  # text-only keys (and file splits) are unchanged


def _row_error(tmp_path: Path, row: dict[str, Any], **kwargs: Any) -> str:
    good = {"prompt": "fine", "answer": "1", "image": None}  # a text-only row: no images
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(HoneDataError) as caught:
        load_samples(str(path), **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path} line 2")  # one line naming the row
    return message


def test_bad_images_are_one_line_naming_the_row_and_field(tmp_path: Path) -> None:
    png(tmp_path / "ok.png", "red")
    (tmp_path / "x.png").write_text("not an image")
    one = {"prompt": ASK, "answer": "1"}
    assert "field 'image'" in _row_error(tmp_path, {**one, "image": "gone.png"}, image_field="image")
    assert "image file not found" in _row_error(tmp_path, {**one, "image": "gone.png"}, image_field="image")
    message = _row_error(tmp_path, {**one, "image": "x.png"}, image_field="image")
    assert "field 'image'" in message and "not a readable image" in message and "x.png" in message
    message = _row_error(tmp_path, {**one, "image": ["ok.png", "x.png"]}, image_field="image")
    assert "field 'image' image 1: not a readable image" in message
    message = _row_error(tmp_path, {**one, "image": ["ok.png", "ok.png"]}, image_field="image")
    assert "field 'image' has 2 image(s) for 1 image placeholder(s) in field 'prompt'" in message
    two = {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}], "answer": "1"}
    message = _row_error(tmp_path, {**two, "image": "ok.png"}, image_field="image")
    assert "has 1 image(s) for 2 image placeholder(s)" in message
    assert "no image field" in _row_error(tmp_path, two)
    assert "missing field 'image'" in _row_error(tmp_path, one, image_field="image")
    message = _row_error(tmp_path, {**one, "image": 3}, image_field="image")
    assert "field 'image': expected an image path, bytes or image, got int" in message
    inline = [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]
    message = _row_error(tmp_path, {"prompt": inline, "answer": "1"})
    assert "field 'prompt' message 0 part 0: not a readable image" in message


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([{"type": "video"}], r"field 'prompt' message 0 part 0 must be a .* part, got 'video'"),
        (["just text"], r"message 0 part 0 must be a .* part, got 'str'"),
        ([{"type": "text"}], r"message 0 part 0 is a text part without a string 'text'"),
        (
            [{"type": "text", "text": "a"}, {"type": "image", "text": "b"}],
            r"part 1 is an image part with 'text'",
        ),
        (5, r"field 'prompt' message 0 needs string 'role' and 'content'"),
    ],
)
def test_malformed_parts_name_the_row_message_and_part(tmp_path: Path, content: Any, message: str) -> None:
    row = {"prompt": [{"role": "user", "content": content}], "answer": "1"}
    assert re.search(message, _row_error(tmp_path, row))


def test_fill_images_counts_placeholders_without_their_own_image() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q"}]}
    ]
    out, images = fill_images(messages, ["ref"], None, "w", image_field="img")
    assert images == ["ref"] and out == messages
    with pytest.raises(HoneDataError, match=r"^w: field 'img' has 0 image\(s\) for 1 image placeholder"):
        fill_images(messages, [], None, "w", image_field="img")


def test_load_image_names_where_a_late_failure_happened(tmp_path: Path) -> None:
    path = png(tmp_path / "t.png", "red", size=(40, 40))
    path.write_bytes(path.read_bytes()[:60])  # header intact, pixels cut off: passes the read-time check
    assert resolve_image(str(path), None, "row 3") == str(path)
    with pytest.raises(HoneDataError, match=r"^sample s-1: cannot read image .*t\.png"):
        load_image(str(path), "sample s-1")

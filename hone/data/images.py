"""Images in prompt data: references checked when the data is read, pixels decoded when a prompt is encoded.

Why two steps: a vision dataset can hold far more pixels than memory, and decoding every image at start-up
would cost minutes. Reading rows only resolves each reference (a path relative to the data file, raw bytes,
the `{"bytes", "path"}` dict of an HF `datasets` Image column, or a PIL image) and opens its header, which
PIL reads without decoding pixels; a missing or unreadable file then fails at start-up with one line naming
the row and field, not minutes into a run. `load_image` decodes when the prompt is encoded; resizing is
the processor's (its min/max pixel rules), not done here.

Chat messages carry images as content parts in the HF processor's chat format: `{"type": "image"}` is a
placeholder filled from the data's image column in order, and `{"type": "image", "image": <ref>}` (or
`"path"`) carries its own image. Messages that come from elsewhere (an environment's observation, an
OpenAI-format client such as verifiers) may also carry `{"type": "image_url", "image_url": {"url":
"data:image/png;base64,..."}}`: `take_images` reads both kinds (`decode_data_url` the URL's bytes).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from hone.data.errors import HoneDataError

# Keys of an image part that hold the part's own image (the HF processor chat format's names).
INLINE_KEYS = ("image", "path")
# Content part types a prompt may hold; audio/video are not supported by any Hone model.
PART_TYPES = ("text", "image")


def load_image(ref: Any, where: str = "") -> Image.Image:
    """Decode `ref` (PIL image, path, bytes, or an HF Image column's `{"bytes", "path"}` dict) to RGB.

    Errors are `HoneDataError`s starting with `where` (e.g. "data.jsonl line 3 field 'image'")."""
    prefix = f"{where}: " if where else ""
    if isinstance(ref, Image.Image):
        image = ref
    else:
        source = _source(ref, where)
        try:
            image = Image.open(source)
            image.load()  # decode now, inside the try: a truncated file fails here, not in the processor
        except (OSError, UnidentifiedImageError, ValueError) as e:  # PIL's decode errors are OSErrors
            raise HoneDataError(f"{prefix}cannot read image {_describe(ref)} ({e})") from e
    # Processors expect 3 channels; palette, grey and RGBA images are converted (alpha dropped).
    return image if image.mode == "RGB" else image.convert("RGB")


def resolve_image(ref: Any, base_dir: Path | None, where: str) -> Any:
    """`ref` as it is kept in `Sample.images`: a path made absolute against `base_dir` (the data file's
    directory; None: the working directory), an HF Image dict reduced to its bytes or path, bytes and PIL
    images as they are. Checks a path exists and a file's or bytes' header is an image (pixels are not
    decoded); a bad reference raises a `HoneDataError` naming `where`."""
    if isinstance(ref, Image.Image):
        return ref
    if isinstance(ref, Mapping):
        ref = _from_column_dict(ref, where)
    if isinstance(ref, bytes | bytearray):
        ref = bytes(ref)
        _check_header(io.BytesIO(ref), "bytes", where)
        return ref
    if isinstance(ref, str | Path):
        if str(ref) == "":
            raise HoneDataError(f"{where}: empty image path")
        path = Path(ref).expanduser()
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        if not path.is_file():
            raise HoneDataError(f"{where}: image file not found: {path}")
        _check_header(path, str(path), where)
        return str(path)
    raise HoneDataError(f"{where}: expected an image path, bytes or image, got {type(ref).__name__}")


def image_refs(value: Any, base_dir: Path | None, where: str) -> list[Any]:
    """A column's value (one reference, a list of them, or None for none) as resolved references."""
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple) else [value]
    return [
        resolve_image(item, base_dir, f"{where} image {i}" if len(items) > 1 else where)
        for i, item in enumerate(items)
    ]


def image_parts(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many `{"type": "image"}` content parts `messages` hold (with or without their own image)."""
    return sum(1 for part in _parts(messages) if part.get("type") == "image")


def fill_images(
    messages: list[dict[str, Any]],
    column: list[Any],
    base_dir: Path | None,
    where: str,
    *,
    messages_field: str = "messages",
    image_field: str | None = None,
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages with every image part reduced to a bare `{"type": "image"}` placeholder, and the images in
    part order: a part's own image (`image`/`path` key) where it has one, else the next of `column` (the
    data's image field, resolved). The counts must match: a placeholder without an image, or an image
    without a placeholder, would shift every later image onto the wrong part, so either is an error.

    Messages with no image part at all take the column's images as TRL's vision-language rows do
    (`trl.data_utils.prepare_multimodal_messages`): placeholders before the text of the first user message
    whose content is a string, so `{"prompt": [{"role": "user", "content": "What is shown?"}], "image": ...}`
    loads as it trains in TRL."""
    if column and image_parts(messages) == 0:
        messages = _placeholders_first(messages, len(column))
    images: list[Any] = []
    taken = 0
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            if part.get("type") != "image":
                parts.append(part)
                continue
            own = [k for k in INLINE_KEYS if part.get(k) is not None]
            if own:
                at = f"{where}: field {messages_field!r} message {i} part {j}"
                images.append(resolve_image(part[own[0]], base_dir, at))
            elif taken < len(column):
                images.append(column[taken])
                taken += 1
            else:
                taken += 1  # counted, to report how many placeholders there are
            parts.append({k: v for k, v in part.items() if k not in INLINE_KEYS})
        out.append({**message, "content": parts})
    if taken != len(column):
        if image_field is None:
            raise HoneDataError(
                f'{where}: field {messages_field!r} has {taken} image placeholder(s) ({{"type": "image"}} '
                "parts without their own image) and no image field (data.image_field) to fill them"
            )
        raise HoneDataError(
            f"{where}: field {image_field!r} has {len(column)} image(s) for {taken} image placeholder(s) in "
            f'field {messages_field!r} ({{"type": "image"}} parts without their own image); each image needs '
            "exactly one placeholder"
        )
    return out, images


def _placeholders_first(messages: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """`messages` with `n` image placeholders before the text of the first user message with string
    content (unchanged when there is none: the count check then names the mismatch)."""
    for i, message in enumerate(messages):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            parts = [{"type": "image"} for _ in range(n)] + [{"type": "text", "text": message["content"]}]
            return [*messages[:i], {**message, "content": parts}, *messages[i + 1 :]]
    return messages


def decode_data_url(url: str, where: str = "") -> bytes:
    """The bytes of an image `data:` URL (`data:image/png;base64,...`, as OpenAI clients send images).
    A remote URL (http...) is refused: Hone fetches nothing during a rollout. Raises `HoneDataError`."""
    prefix = f"{where}: " if where else ""
    if not url.startswith("data:"):
        shown = url if len(url) <= 60 else url[:57] + "..."
        raise HoneDataError(f"{prefix}image URL {shown!r} is not a data: URL (remote images are not fetched)")
    header, comma, payload = url[5:].partition(",")
    if not comma or not payload:
        raise HoneDataError(f"{prefix}image data: URL holds no data")
    try:
        if header.endswith(";base64"):
            return base64.b64decode(payload, validate=True)
        return urllib.parse.unquote_to_bytes(payload)
    except (binascii.Error, ValueError) as e:
        raise HoneDataError(f"{prefix}image data: URL is not valid base64 ({e})") from e


def take_images(
    messages: Sequence[Mapping[str, Any]], where: str, fill: Sequence[Any] = ()
) -> tuple[list[dict[str, Any]], list[Any]]:
    """`messages` with every image part reduced to a bare `{"type": "image"}` placeholder (what a chat
    template renders), and the parts' images in order, unopened: a part's own (`image` / `path` key, or an
    OpenAI `image_url` part's data URL, decoded to bytes), else the next of `fill` (a sample's images).
    Unlike `fill_images` (data files), nothing is resolved against a directory. Every image of `fill` must
    be placed and every placeholder filled; a mismatch raises `HoneDataError` naming `where`."""
    images: list[Any] = []
    taken = 0
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(_is_image(p) for p in content):
            out.append(dict(message))
            continue
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            if not _is_image(part):
                parts.append(part)
                continue
            at = f"{where} message {i} part {j}"
            own = [k for k in INLINE_KEYS if part.get(k) is not None]
            if part.get("type") == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, Mapping) else url
                images.append(decode_data_url(str(url or ""), at))
            elif own:
                images.append(part[own[0]])
            elif taken < len(fill):
                images.append(fill[taken])
                taken += 1
            else:
                raise HoneDataError(
                    f"{at}: an image placeholder with no image (no 'image' key, none left to fill)"
                )
            parts.append({"type": "image"})
        out.append({**message, "content": parts})
    if taken != len(fill):
        raise HoneDataError(
            f'{where}: {len(fill)} image(s) for {taken} image placeholder(s) ({{"type": "image"}} parts '
            "without their own image); each image needs exactly one placeholder"
        )
    return out, images


def has_images(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether `messages` hold an image part, either kind (`image` or OpenAI `image_url`)."""
    return any(_is_image(part) for part in _parts(messages))


def _is_image(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") in ("image", "image_url")


def image_key(ref: Any) -> str:
    """A reference's identity for de-duplication and splits: the path of a file, a digest of bytes or of
    a PIL image's pixels (decoded images only: a PIL image here was decoded by its dataset already)."""
    if isinstance(ref, str | Path):
        return f"path:{ref}"
    if isinstance(ref, bytes):
        return f"sha256:{hashlib.sha256(ref).hexdigest()}"
    if isinstance(ref, Image.Image):
        digest = hashlib.sha256(f"{ref.mode}{ref.size}".encode())
        digest.update(ref.tobytes())
        return f"pixels:{digest.hexdigest()}"
    return f"repr:{ref!r}"


def _parts(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [
        part
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, Mapping)
    ]


def _from_column_dict(ref: Mapping[str, Any], where: str) -> Any:
    """An HF `datasets` Image value read without decoding: embedded bytes win over the original path."""
    if ref.get("bytes") is not None:
        return ref["bytes"]
    if ref.get("path") is not None:
        return ref["path"]
    raise HoneDataError(f"{where}: image has neither 'bytes' nor 'path' (keys: {sorted(ref)})")


def _source(ref: Any, where: str) -> Any:
    if isinstance(ref, Mapping):
        ref = _from_column_dict(ref, where)
    if isinstance(ref, bytes | bytearray):
        return io.BytesIO(bytes(ref))
    if isinstance(ref, str | Path):
        return Path(ref).expanduser()
    prefix = f"{where}: " if where else ""
    raise HoneDataError(f"{prefix}expected an image path, bytes or image, got {type(ref).__name__}")


def _check_header(source: Path | io.BytesIO, name: str, where: str) -> None:
    try:
        with Image.open(source) as image:  # lazy: reads the header (format, size), not the pixels
            image.size  # noqa: B018  -- touched so a header without dimensions fails here
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise HoneDataError(f"{where}: not a readable image: {name} ({e})") from e


def _describe(ref: Any) -> str:
    if isinstance(ref, Mapping):
        return str(ref.get("path") or "bytes")
    return "bytes" if isinstance(ref, bytes | bytearray) else str(ref)

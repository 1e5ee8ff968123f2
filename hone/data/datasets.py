"""Load prompt records from local files or Hugging Face datasets into `Sample`s.

Why one loader with strict checks: a bad row found mid-run (after minutes of rollouts) is far more
expensive than one found at start-up, so every row is validated here and errors name file, row and field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hone.data.errors import HoneDataError
from hone.data.images import PART_TYPES, fill_images, image_refs
from hone.types import Sample

_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def load_samples(
    source: str,
    *,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    messages_field: str | None = None,
    id_field: str | None = None,
    image_field: str | None = None,
    split: str = "train",
    subset: str | None = None,
    require_answer: bool = True,
    answer_needed_by: str | None = None,
    limit: int | None = None,
) -> list[Sample]:
    """Read `source` (.jsonl / .json / .parquet file, `save_to_disk` directory, or hub dataset name).

    A row becomes a chat `Sample` when `messages_field` is given, or when its prompt field holds a list
    of messages (the TRL conversational format); otherwise the prompt is plain text. Fields other than
    prompt/messages/answer/id go to `Sample.meta`. Without `id_field`, ids are `<source name>-<row>`.
    `subset` is the hub dataset configuration (e.g. "main" for gsm8k); `split` also picks the split of
    a saved `DatasetDict`.

    `image_field` names a column of images (a path, relative to the data file's directory, or a list of
    them; bytes; an HF `datasets` Image column) for `Sample.images`; image parts of messages that carry
    their own image (`{"type": "image", "image": <ref>}`) are collected too. References are checked (the
    file exists, its header is an image) but not decoded: `hone.data.images.load_image` does that.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    name, rows = read_rows(source, split=split, subset=subset)
    local = Path(source).expanduser()
    # Relative image paths are relative to the directory holding the data (file or saved dataset), so a
    # dataset and its images move together; a hub dataset's are relative to the working directory.
    base_dir = local.resolve().parent if local.exists() else None
    fields = _Fields(
        prompt_field, answer_field, messages_field, id_field, require_answer, image_field, base_dir
    )
    fields.answer_needed_by = answer_needed_by if require_answer else None
    samples: list[Sample] = []
    seen_ids: dict[str, str] = {}
    for where, row in rows:
        if limit is not None and len(samples) >= limit:
            break
        sample = fields.to_sample(row, where, default_id=f"{Path(name).stem}-{len(samples)}")
        if sample.id in seen_ids:
            raise HoneDataError(
                f"{where}: duplicate id {sample.id!r} in field {id_field!r} (first at {seen_ids[sample.id]})"
            )
        seen_ids[sample.id] = where
        samples.append(sample)
    if not samples and limit != 0:
        raise HoneDataError(f"{source}: no rows")
    return samples


def read_rows(
    source: str, *, split: str = "train", subset: str | None = None
) -> tuple[str, Iterator[tuple[str, Any]]]:
    """The raw rows of `source` (a file, a `save_to_disk` directory or a hub dataset name) as `(where, row)`,
    `where` naming the file and row for error messages; and the source's short name (for default ids)."""
    path = Path(source).expanduser()
    if path.exists():
        return path.name, _read_local(path, split)
    if path.suffix in _FILE_SUFFIXES or source.startswith(("/", ".", "~")):
        raise HoneDataError(f"{source}: file not found")
    return source, _read_hub(source, subset, split)


class _Fields:
    """Column names and the per-row conversion; `where` in messages is e.g. "data.jsonl line 3"."""

    def __init__(
        self,
        prompt: str,
        answer: str,
        messages: str | None,
        id_: str | None,
        require_answer: bool,
        image: str | None = None,
        base_dir: Path | None = None,
    ) -> None:
        self.prompt, self.answer, self.messages, self.id = prompt, answer, messages, id_
        self.require_answer, self.image, self.base_dir = require_answer, image, base_dir
        self.answer_needed_by: str | None = None  # what reads the answer, for the missing-answer error

    def to_sample(self, row: Any, where: str, default_id: str) -> Sample:
        if not isinstance(row, Mapping):
            raise HoneDataError(f"{where}: expected an object, got {type(row).__name__}")
        prompt_key = self.messages or self.prompt
        if row.get(prompt_key) is None:
            raise HoneDataError(f"{where}: missing field {prompt_key!r} (fields: {sorted(row)})")
        value = row[prompt_key]
        prompt, messages = None, None
        if self.messages or isinstance(value, list):
            messages = check_messages(value, where, prompt_key)
        elif isinstance(value, str):
            prompt = value
        else:
            raise HoneDataError(f"{where}: field {prompt_key!r} must be a string, got {type(value).__name__}")
        images = self._images(row, where)
        if messages is not None:
            messages, images = fill_images(
                messages, images, self.base_dir, where, messages_field=prompt_key, image_field=self.image
            )
        return Sample(
            id=self._id(row, where, default_id),
            prompt=prompt,
            messages=messages,
            answer=self._answer(row, where),
            meta={k: v for k, v in row.items() if k not in {prompt_key, self.answer, self.id, self.image}},
            images=images or None,  # None, not []: a text-only sample stays as it was before images
        )

    def _images(self, row: Mapping[str, Any], where: str) -> list[Any]:
        """The image column's references, resolved and header-checked; a row may hold None (no images),
        but a missing column is an error: a misspelt `image_field` must not silently drop every image."""
        if self.image is None:
            return []
        if self.image not in row:
            raise HoneDataError(f"{where}: missing field {self.image!r} (fields: {sorted(row)})")
        return image_refs(row[self.image], self.base_dir, f"{where} field {self.image!r}")

    def _id(self, row: Mapping[str, Any], where: str, default_id: str) -> str:
        if self.id is None:
            return default_id
        value = row.get(self.id)
        if not isinstance(value, str | int) or isinstance(value, bool) or value == "":
            raise HoneDataError(
                f"{where}: id field {self.id!r} must be a non-empty string or int, got {value!r}"
            )
        return str(value)

    def _answer(self, row: Mapping[str, Any], where: str) -> str | None:
        value = row.get(self.answer)
        if value is None:
            if self.require_answer and self.answer_needed_by is not None:
                raise HoneDataError(
                    f"{where}: no answer column {self.answer!r} (fields: {sorted(row)}); "
                    f"{self.answer_needed_by} checks responses against the reference answer: set "
                    "data.answer_field=<column> to the column holding it, or use a reward that needs none"
                )
            if self.require_answer:
                raise HoneDataError(f"{where}: missing field {self.answer!r} (fields: {sorted(row)})")
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise HoneDataError(f"{where}: field {self.answer!r} must be a string or number, got {value!r}")
        return str(value)


def check_messages(value: Any, where: str, field: str) -> list[dict[str, Any]]:
    """Copies of chat messages, each with a string `role` and a `content` that is a string or a list of
    content parts (the HF processor chat format): `{"type": "text", "text": str}` or `{"type": "image"}`,
    the latter optionally with its own image (`image` or `path` key)."""
    if not isinstance(value, list) or not value:
        raise HoneDataError(f"{where}: field {field!r} must be a non-empty list of messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str | list)
        ):
            raise HoneDataError(
                f"{where}: field {field!r} message {i} needs string 'role' and 'content' (a string or a list "
                "of content parts)"
            )
        copy = dict(message)
        if isinstance(copy["content"], list):
            copy["content"] = [
                _check_part(p, where, f"field {field!r} message {i} part {j}")
                for j, p in enumerate(copy["content"])
            ]
        out.append(copy)
    return out


def _check_part(part: Any, where: str, at: str) -> dict[str, Any]:
    if not isinstance(part, Mapping) or part.get("type") not in PART_TYPES:
        got = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        raise HoneDataError(
            f"{where}: {at} must be a {{'type': 'text', 'text': ...}} or {{'type': 'image'}} part, "
            f"got {got!r}"
        )
    # Arrow-backed rows (parquet, HF datasets) give every part every key, absent ones as None: dropped, so
    # the chat template sees the parts a JSON file would give (no `image: None` on a text part).
    kept = {k: v for k, v in part.items() if v is not None}
    if kept["type"] == "text" and not isinstance(kept.get("text"), str):
        raise HoneDataError(f"{where}: {at} is a text part without a string 'text'")
    if kept["type"] == "image" and "text" in kept:
        raise HoneDataError(f"{where}: {at} is an image part with 'text'; put the text in a part of its own")
    return kept


def _read_local(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    if path.is_dir():
        return _read_saved_dataset(path, split)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".json":
        return _read_json(path, split)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    raise HoneDataError(f"{path}: unsupported file type; expected one of {', '.join(_FILE_SUFFIXES)}")


def _read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise HoneDataError(
                    f"{path} line {number}: malformed JSON ({e.msg} at column {e.colno})"
                ) from e
            yield f"{path} line {number}", row


def _read_json(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    """A top-level list of rows, or an object mapping split names to lists of rows."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise HoneDataError(f"{path}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    if isinstance(data, dict):
        if not isinstance(data.get(split), list):
            raise HoneDataError(f"{path}: expected a list of rows, or an object with a {split!r} list")
        data = data[split]
    if not isinstance(data, list):
        raise HoneDataError(f"{path}: expected a list of rows, got {type(data).__name__}")
    return ((f"{path} row {i}", row) for i, row in enumerate(data, start=1))


def _read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq  # deferred: only parquet users pay for the import

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several unrelated types for corrupt files
        raise HoneDataError(f"{path}: cannot read parquet ({e})") from e
    return ((f"{path} row {i}", row) for i, row in enumerate(rows, start=1))


def _read_saved_dataset(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    import datasets  # deferred: importing `datasets` costs seconds

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as e:
        raise HoneDataError(f"{path}: not a dataset saved with `save_to_disk` ({e})") from e
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise HoneDataError(f"{path}: no split {split!r}; splits: {sorted(loaded)}")
        loaded = loaded[split]
    return ((f"{path} row {i}", row) for i, row in enumerate(loaded, start=1))


def _read_hub(name: str, subset: str | None, split: str) -> Iterator[tuple[str, Any]]:
    import datasets

    try:
        loaded = datasets.load_dataset(name, subset, split=split)
    except Exception as e:  # network, auth and missing-dataset errors all arrive as different types
        raise HoneDataError(f"{name}: cannot load dataset (split {split!r}): {e}") from e
    return ((f"{name}[{split}] row {i}", row) for i, row in enumerate(loaded, start=1))

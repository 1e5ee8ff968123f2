"""Load preference pairs (a prompt, a chosen and a rejected response) for DPO and reward-model training.

The formats are TRL's preference formats, from the same files and hub datasets as RL prompts
(`read_rows`), with the same one-line errors naming file, row and field:
- standard: `prompt`, `chosen` and `rejected` are strings;
- conversational: `prompt` is a list of `{role, content}` messages and `chosen`/`rejected` are lists
  holding the assistant's reply;
- implicit prompt: no prompt field, `chosen` and `rejected` are whole conversations; the prompt is the
  messages they share from the start (as TRL's `extract_prompt`).

Every row is checked before any model loads: a pair that cannot teach anything (a missing or empty
response, chosen identical to rejected) is an error, not a silently dropped row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.data.datasets import check_messages, read_rows
from hone.data.errors import HoneDataError
from hone.data.images import image_parts
from hone.types import Sample


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: `sample` holds the prompt (text or chat messages, as an RL prompt would), `chosen`
    and `rejected` the two responses' text; `margin` (TRL's optional column) how much better chosen is."""

    sample: Sample
    chosen: str
    rejected: str
    margin: float | None = None


def load_preferences(
    source: str,
    *,
    prompt_field: str = "prompt",
    chosen_field: str = "chosen",
    rejected_field: str = "rejected",
    margin_field: str = "margin",
    split: str = "train",
    subset: str | None = None,
    limit: int | None = None,
) -> list[PreferencePair]:
    """Read and check every pair of `source` (.jsonl / .json / .parquet, `save_to_disk` dir, hub name)."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    name, rows = read_rows(source, split=split, subset=subset)
    fields = _PreferenceFields(prompt_field, chosen_field, rejected_field, margin_field)
    pairs: list[PreferencePair] = []
    for where, row in rows:
        if limit is not None and len(pairs) >= limit:
            break
        pairs.append(fields.to_pair(row, where, f"{Path(name).stem}-{len(pairs)}"))
    if not pairs and limit != 0:
        raise HoneDataError(f"{source}: no rows")
    return pairs


@dataclass(frozen=True)
class _PreferenceFields:
    prompt: str
    chosen: str
    rejected: str
    margin: str

    def to_pair(self, row: Any, where: str, sample_id: str) -> PreferencePair:
        if not isinstance(row, Mapping):
            raise HoneDataError(f"{where}: expected an object, got {type(row).__name__}")
        for key in (self.chosen, self.rejected):
            if row.get(key) is None:
                raise HoneDataError(f"{where}: missing field {key!r} (fields: {sorted(row)})")
        chosen, rejected, prompt = row[self.chosen], row[self.rejected], row.get(self.prompt)
        if chosen == rejected:
            raise self._identical(where)
        if prompt is None:
            if not (isinstance(chosen, list) and isinstance(rejected, list)):
                raise HoneDataError(
                    f"{where}: missing field {self.prompt!r} (an implicit prompt needs chosen and "
                    f"rejected as conversations; fields: {sorted(row)})"
                )
            prompt, chosen, rejected = _split_shared_prefix(
                check_messages(chosen, where, self.chosen), check_messages(rejected, where, self.rejected)
            )
            if not prompt:
                raise HoneDataError(
                    f"{where}: fields {self.chosen!r} and {self.rejected!r} share no opening messages "
                    "to take as the prompt"
                )
        sample = Sample(id=sample_id, **self._prompt(prompt, where))
        chosen_text = self._response(chosen, self.chosen, where)
        rejected_text = self._response(rejected, self.rejected, where)
        if chosen_text == rejected_text:
            raise self._identical(where)
        return PreferencePair(sample, chosen_text, rejected_text, self._margin(row, where))

    def _identical(self, where: str) -> HoneDataError:
        return HoneDataError(
            f"{where}: fields {self.chosen!r} and {self.rejected!r} are identical; a pair must differ"
        )

    def _prompt(self, value: Any, where: str) -> dict[str, Any]:
        if isinstance(value, list):
            messages = check_messages(value, where, self.prompt)
            if image_parts(messages):  # DPO and reward models here are text-only: an image would be dropped
                raise HoneDataError(
                    f"{where}: field {self.prompt!r} has image parts; preference data is text-only"
                )
            return {"messages": messages}
        if not isinstance(value, str):
            raise HoneDataError(f"{where}: field {self.prompt!r} must be a string or a list of messages")
        if not value.strip():
            raise HoneDataError(f"{where}: field {self.prompt!r} is empty")
        return {"prompt": value}

    def _response(self, value: Any, field: str, where: str) -> str:
        """The response's text: the string itself, or the content of the one assistant message."""
        if isinstance(value, list):
            messages = check_messages(value, where, field)
            if len(messages) != 1 or messages[0]["role"] != "assistant":
                roles = [m["role"] for m in messages]
                raise HoneDataError(
                    f"{where}: field {field!r} must hold one assistant message after the prompt, got {roles}"
                )
            value = messages[0]["content"]
        if not isinstance(value, str):
            raise HoneDataError(f"{where}: field {field!r} must be a string or a list of messages")
        if not value.strip():
            raise HoneDataError(f"{where}: field {field!r} is an empty response")
        return value

    def _margin(self, row: Mapping[str, Any], where: str) -> float | None:
        value = row.get(self.margin)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise HoneDataError(f"{where}: field {self.margin!r} must be a number, got {value!r}")
        return float(value)


def _split_shared_prefix(
    chosen: list[dict[str, Any]], rejected: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(shared opening messages, chosen's rest, rejected's rest): the implicit prompt, as TRL extracts it."""
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    return chosen[:shared], chosen[shared:], rejected[shared:]

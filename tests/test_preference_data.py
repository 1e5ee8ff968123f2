"""`load_preferences`: TRL's preference formats, field mapping, one-line errors naming file, row, field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hone.data import HoneDataError, load_preferences
from tests.helpers import write_jsonl

USER = {"role": "user", "content": "2+2="}


def reply(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_standard_conversational_and_implicit_prompt_rows(tmp_path: Path) -> None:
    rows = [
        {"prompt": "2+2=", "chosen": "4", "rejected": "5", "margin": 2},
        {"prompt": [USER], "chosen": reply("4"), "rejected": reply("5")},
        # Implicit prompt: whole conversations; the shared opening messages are the prompt.
        {"chosen": [USER, *reply("4")], "rejected": [USER, *reply("5")]},
    ]
    pairs = load_preferences(str(write_jsonl(tmp_path / "prefs.jsonl", rows)))
    assert [(p.sample.prompt, p.sample.messages, p.chosen, p.rejected, p.margin) for p in pairs] == [
        ("2+2=", None, "4", "5", 2.0),
        (None, [USER], "4", "5", None),
        (None, [USER], "4", "5", None),
    ]
    assert [p.sample.id for p in pairs] == ["prefs-0", "prefs-1", "prefs-2"]


def test_field_mapping_and_parquet(tmp_path: Path) -> None:
    import datasets

    rows = [{"question": "1+1=", "good": "2", "bad": "3"}, {"question": "1+2=", "good": "3", "bad": "4"}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "p.parquet"))
    pairs = load_preferences(
        str(tmp_path / "p.parquet"), prompt_field="question", chosen_field="good", rejected_field="bad"
    )
    assert [(p.sample.prompt, p.chosen, p.rejected) for p in pairs] == [
        ("1+1=", "2", "3"),
        ("1+2=", "3", "4"),
    ]


GOOD: dict[str, Any] = {"prompt": "2+2=", "chosen": "4", "rejected": "5"}


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ({"prompt": "2+2=", "chosen": "4"}, r"line 2: missing field 'rejected'"),
        ({"prompt": "2+2=", "rejected": "5"}, r"line 2: missing field 'chosen'"),
        (
            {"prompt": "2+2=", "chosen": "4", "rejected": "4"},
            r"line 2: fields 'chosen' and 'rejected' are identical",
        ),
        ({"prompt": "2+2=", "chosen": "  ", "rejected": "5"}, r"line 2: field 'chosen' is an empty response"),
        ({"prompt": "2+2=", "chosen": "4", "rejected": ""}, r"line 2: field 'rejected' is an empty response"),
        (
            {"prompt": [USER], "chosen": reply(""), "rejected": reply("5")},
            r"line 2: field 'chosen' is an empty",
        ),
        ({"prompt": "", "chosen": "4", "rejected": "5"}, r"line 2: field 'prompt' is empty"),
        ({"chosen": "4", "rejected": "5"}, r"line 2: missing field 'prompt' \(an implicit prompt needs"),
        (
            {"chosen": [USER, *reply("4")], "rejected": [USER, *reply("4")]},
            r"line 2: fields 'chosen' and 'rejected' are identical",
        ),
        (
            {"prompt": [USER], "chosen": [USER, *reply("4")], "rejected": reply("5")},
            r"line 2: field 'chosen' must hold one assistant message after the prompt, "
            r"got \['user', 'assistant'\]",
        ),
        ({"prompt": "2+2=", "chosen": 4, "rejected": "5"}, r"line 2: field 'chosen' must be a string"),
        ({**GOOD, "margin": "big"}, r"line 2: field 'margin' must be a number"),
    ],
)
def test_bad_rows_fail_with_one_line_naming_file_row_and_field(
    tmp_path: Path, bad_row: dict[str, Any], message: str
) -> None:
    path = write_jsonl(tmp_path / "prefs.jsonl", [GOOD, bad_row])
    with pytest.raises(HoneDataError, match=rf"^{tmp_path}/prefs.jsonl {message}") as raised:
        load_preferences(str(path))
    assert "\n" not in str(raised.value)


def test_mapped_field_names_appear_in_errors(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "prefs.jsonl", [{"q": "2+2=", "good": "4", "bad": "4"}])
    with pytest.raises(HoneDataError, match=r"line 1: fields 'good' and 'bad' are identical"):
        load_preferences(str(path), prompt_field="q", chosen_field="good", rejected_field="bad")


def test_missing_file_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(HoneDataError, match=r"missing.jsonl: file not found"):
        load_preferences(str(tmp_path / "missing.jsonl"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(HoneDataError, match=r"empty.jsonl: no rows"):
        load_preferences(str(tmp_path / "empty.jsonl"))

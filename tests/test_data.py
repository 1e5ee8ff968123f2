"""`load_samples`: local files, saved datasets, and errors that name file, row and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hone.data import HoneDataError, load_samples
from tests.helpers import write_jsonl

ROWS: list[dict[str, Any]] = [
    {"prompt": "1+1=", "answer": "2", "level": 1},
    {"prompt": "2*3=", "answer": 6, "level": 2},
]


def test_jsonl_rows_become_samples_with_extras_in_meta(tmp_path: Path) -> None:
    samples = load_samples(str(write_jsonl(tmp_path / "math.jsonl", ROWS)))
    assert [(s.id, s.prompt, s.messages, s.answer, s.meta) for s in samples] == [
        ("math-0", "1+1=", None, "2", {"level": 1}),
        ("math-1", "2*3=", None, "6", {"level": 2}),  # numeric answers become strings
    ]


def test_json_parquet_and_saved_dataset_read_the_same(tmp_path: Path) -> None:
    import datasets

    (tmp_path / "list.json").write_text(json.dumps(ROWS))
    (tmp_path / "splits.json").write_text(json.dumps({"train": ROWS, "test": ROWS[:1]}))
    rows = [{**r, "answer": str(r["answer"])} for r in ROWS]  # arrow columns need one type
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
    ).save_to_disk(str(tmp_path / "saved"))
    expected = [("1+1=", "2", {"level": 1}), ("2*3=", "6", {"level": 2})]
    for name in ["list.json", "splits.json", "rows.parquet", "saved"]:
        samples = load_samples(str(tmp_path / name))
        assert [(s.prompt, s.answer, s.meta) for s in samples] == expected, name
    assert [s.prompt for s in load_samples(str(tmp_path / "saved"), split="test")] == ["1+1="]
    assert [s.prompt for s in load_samples(str(tmp_path / "splits.json"), split="test")] == ["1+1="]
    with pytest.raises(HoneDataError, match=r"saved: no split 'dev'; splits: \['test', 'train'\]"):
        load_samples(str(tmp_path / "saved"), split="dev")


def test_custom_fields_ids_limit_and_optional_answer(tmp_path: Path) -> None:
    rows = [{"q": f"{i}+0=", "uid": f"u{i}", "sol": str(i)} for i in range(5)] + [{"q": "x", "uid": "u9"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    samples = load_samples(str(path), prompt_field="q", answer_field="sol", id_field="uid", limit=3)
    assert [(s.id, s.prompt, s.answer, s.meta) for s in samples] == [
        ("u0", "0+0=", "0", {}),
        ("u1", "1+0=", "1", {}),
        ("u2", "2+0=", "2", {}),
    ]
    unanswered = load_samples(str(path), prompt_field="q", answer_field="sol", require_answer=False)
    assert unanswered[-1].answer is None and len(unanswered) == 6


def test_chat_messages_from_messages_field_or_list_valued_prompt(tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"conversation": chat, "prompt": chat, "answer": "4"}])
    by_field = load_samples(str(path), messages_field="conversation")[0]
    assert by_field.prompt is None and by_field.messages == chat and by_field.meta == {"prompt": chat}
    by_prompt = load_samples(str(path))[0]  # TRL's conversational format: prompt is a message list
    assert by_prompt.messages == chat and by_prompt.meta == {"conversation": chat}


@pytest.mark.parametrize(
    ("lines", "kwargs", "message"),
    [
        (
            ['{"prompt": "a", "answer": "1"}', '{"prompt": "b", "answer": '],
            {},
            r"d\.jsonl line 2: malformed JSON",
        ),
        (
            ['{"prompt": "a", "answer": "1"}', "", '{"answer": "2"}'],
            {},
            r"d\.jsonl line 3: missing .*'prompt'",
        ),
        (['{"prompt": "a"}'], {}, r"d\.jsonl line 1: missing .*'answer'"),
        (['{"prompt": 5, "answer": "1"}'], {}, r"line 1: field 'prompt' must be a string, got int"),
        (['{"prompt": "a", "answer": [1]}'], {}, r"line 1: field 'answer' must be a string or number"),
        (['["a", "1"]'], {}, r"line 1: expected an object, got list"),
        (
            ['{"m": [{"role": "user"}], "answer": "1"}'],
            {"messages_field": "m"},
            r"line 1: field 'm' message 0",
        ),
        (['{"prompt": "a", "answer": "1"}'], {"id_field": "uid"}, r"line 1: id field 'uid' must be"),
        (['{"prompt": "a", "answer": "1", "k": 1}'] * 2, {"id_field": "k"}, r"line 2: duplicate id '1'"),
        ([""], {}, r"d\.jsonl: no rows"),
    ],
)
def test_bad_rows_name_file_line_and_field(
    tmp_path: Path, lines: list[str], kwargs: dict[str, Any], message: str
) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(HoneDataError, match=message):
        load_samples(str(path), **kwargs)


def test_missing_and_unsupported_sources(tmp_path: Path) -> None:
    with pytest.raises(HoneDataError, match=r"nope\.jsonl: file not found"):
        load_samples(str(tmp_path / "nope.jsonl"))
    with pytest.raises(HoneDataError, match=r"file not found"):
        load_samples("./data/train")  # path-like, so never sent to the hub
    (tmp_path / "d.csv").write_text("prompt,answer\n")
    with pytest.raises(HoneDataError, match=r"d\.csv: unsupported file type"):
        load_samples(str(tmp_path / "d.csv"))
    (tmp_path / "d.json").write_text('{"rows": []}')
    with pytest.raises(HoneDataError, match=r"d\.json: expected a list of rows, or an object with a 'train'"):
        load_samples(str(tmp_path / "d.json"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(HoneDataError, match=r"bad\.parquet: cannot read parquet"):
        load_samples(str(tmp_path / "bad.parquet"))
    with pytest.raises(ValueError, match="limit"):
        load_samples(str(tmp_path / "d.json"), limit=-1)


def test_hub_names_go_to_load_dataset_and_its_failures_are_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls: list[tuple[Any, ...]] = []

    def fake_load_dataset(name: str, subset: str | None, split: str) -> list[dict[str, Any]]:
        calls.append((name, subset, split))
        if name == "org/offline":
            raise ConnectionError("no internet")
        return [{"question": "1+2=", "answer": 3}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    samples = load_samples("openai/gsm8k", subset="main", split="test", prompt_field="question")
    assert [(s.id, s.prompt, s.answer) for s in samples] == [("gsm8k-0", "1+2=", "3")]
    assert calls == [("openai/gsm8k", "main", "test")]
    with pytest.raises(
        HoneDataError, match=r"org/offline: cannot load dataset \(split 'train'\): no internet"
    ):
        load_samples("org/offline")

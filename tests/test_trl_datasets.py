"""TRL's datasets as they are (issue 49, item 2): prompt-only rows, standard (`prompt` a string) and
conversational (`prompt` a list of messages), from JSONL and from a `save_to_disk` directory; their extra
columns in `Sample.meta` and in samples.jsonl's `meta`; a reward that needs the answer column refusing a
prompt-only dataset in one line naming it; TRL's vision rows (`image` / `images` beside string-content
messages); and an eval without an answer column reporting the reward, saying so once. One tiny-model run."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from hone.cli import main
from hone.config import load_config
from hone.data import load_samples
from hone.data.splits import answer_needed_by_recipe, check_data_files, load_data
from hone.rl.components import reports_accuracy
from hone.rl.report import json_safe, response_record
from hone.tracking import read_metrics, read_samples
from hone.types import Rollout, Sample
from tests.helpers import tiny_run

NOTE = "no answer column: eval reports the reward, not accuracy"
LENGTH_REWARD = {"reward.fn": "length", "reward.args.target": 0, "reward.args.coef": 0.01}


class _Bytes:
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return bytes(ids).decode()


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _standard(n: int) -> list[dict[str, Any]]:
    """TRL's standard prompt-only rows: a prompt and extra columns, no answer."""
    return [
        {"prompt": f"{i}+{i}=", "source": "trl", "level": i % 3, "tags": ["x", f"t{i}"]} for i in range(n)
    ]


def _conversational(n: int) -> list[dict[str, Any]]:
    return [
        {"prompt": [{"role": "user", "content": f"Say {i}."}], "source": "chat", "level": i} for i in range(n)
    ]


def _cfg(source: Path, *extra: str) -> Any:
    return load_config(None, ["data.task=null", f"data.source={source}", *extra])


def test_prompt_only_standard_rows_load_with_their_columns_in_meta(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "train.jsonl", _standard(30))
    cfg = _cfg(path, "reward.fn=length")
    assert answer_needed_by_recipe(cfg) is None
    check_data_files(cfg.data, has_env=False, answer_needed_by=None)
    _, train, held = load_data(cfg.data, eval_size=None, seed=0)
    assert len(train) + len(held) == 30 and len(held) == 3
    sample = next(s for s in train if s.prompt == "1+1=")
    assert sample.answer is None and sample.messages is None
    assert sample.meta == {"source": "trl", "level": 1, "tags": ["x", "t1"]}


def test_prompt_only_conversational_rows_load_as_chat_samples(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chat.jsonl", _conversational(4))
    samples = load_samples(str(path), require_answer=False)
    assert samples[0].messages == [{"role": "user", "content": "Say 0."}]
    assert all(s.prompt is None and s.answer is None for s in samples)
    assert samples[3].meta == {"source": "chat", "level": 3}


def test_a_save_to_disk_dataset_loads_offline(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = _conversational(5)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_standard(6))}).save_to_disk(
        str(tmp_path / "dd")
    )
    cfg = _cfg(tmp_path / "ds", "reward.fn=length")
    check_data_files(cfg.data, has_env=False)  # a directory is read like a file: no hub, no network
    chat = load_samples(str(tmp_path / "ds"), require_answer=False)
    assert [s.messages for s in chat] == [r["prompt"] for r in rows]
    assert chat[2].meta == {"source": "chat", "level": 2}
    plain = load_samples(str(tmp_path / "dd"), split="train", require_answer=False)
    assert [s.prompt for s in plain][:2] == ["0+0=", "1+1="] and plain[1].meta["tags"] == ["x", "t1"]


@pytest.mark.parametrize(
    ("overrides", "needed_by"),
    [
        (["reward.fn=length"], None),
        (["reward.fn=format"], None),
        (["reward.fn=judge", "reward.args.model=m", "reward.args.base_url=http://x"], None),
        (["reward.fn=tests.rewards_for_tests:token_id_reward"], None),
        (["reward.fn=math"], "reward.fn math"),
        (["reward.fn=math", "reward.args.answer_field=solution"], None),  # reads meta['solution']
        (
            ["reward.fn=null", "reward.components.acc.fn=math", "reward.components.x.fn=length"],
            "reward.components.acc",
        ),
        (["reward.fn=length", "env.name=retry"], "env.name retry"),
    ],
)
def test_what_needs_the_answer_column(tmp_path: Path, overrides: list[str], needed_by: str | None) -> None:
    found = answer_needed_by_recipe(_cfg(tmp_path / "x.jsonl", *overrides))
    assert found == needed_by if needed_by is None else (found or "").startswith(needed_by)


def test_a_reward_that_needs_the_answer_refuses_prompt_only_rows_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _jsonl(tmp_path / "train.jsonl", _standard(20))
    code = main(["train", "data.task=null", f"data.source={path}", "reward.fn=math", f"run.dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert f"data.source: {path} line 1: no answer column 'answer'" in err
    assert "reward.fn math" in err and "data.answer_field=<column>" in err
    # The same row in a run that needs no answer is fine; a verifier pointed at another column too.
    assert answer_needed_by_recipe(_cfg(path, "reward.fn=math", "reward.args.answer_field=level")) is None


def test_a_vision_row_in_trls_form_loads(tmp_path: Path) -> None:
    """TRL's vision-language rows: string-content messages and an `image` (one) or `images` (a list)
    column; the images go before the first user message's text, as `prepare_multimodal_messages` puts them."""
    for name, color in (("a.png", "red"), ("b.png", "blue")):
        Image.new("RGB", (8, 8), color).save(tmp_path / name)
    ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is shown?"}]
    path = _jsonl(
        tmp_path / "vlm.jsonl",
        [{"prompt": ask, "image": "a.png", "images": ["a.png", "b.png"], "kind": "color"}],
    )
    one = load_samples(str(path), image_field="image", require_answer=False)[0]
    assert one.images == [str(tmp_path / "a.png")]
    assert one.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown?"}]},
    ]
    assert one.meta == {"images": ["a.png", "b.png"], "kind": "color"}
    two = load_samples(str(path), image_field="images", require_answer=False)[0]
    assert two.images == [str(tmp_path / "a.png"), str(tmp_path / "b.png")]
    assert two.messages is not None and two.messages[1]["content"][:2] == [{"type": "image"}] * 2


def test_records_carry_the_samples_meta_json_safe() -> None:
    sample = Sample(id="s", prompt="p", meta={"n": 1, "when": object, "nested": {"t": (1, Image)}})
    rollout = Rollout("s", 0, [104, 105], 1, [0, 1], [0.0], response_text="i")
    record = response_record(rollout, _Bytes(), sample)  # type: ignore[arg-type]
    assert record["meta"] == {"n": 1, "when": repr(object), "nested": {"t": [1, repr(Image)]}}
    json.dumps(record)
    assert "meta" not in response_record(rollout, _Bytes())  # type: ignore[arg-type]  # no sample known: no meta
    assert json_safe({1: [None, True, 2.5]}) == {"1": [None, True, 2.5]}


def test_accuracy_needs_an_answer_or_a_grader(tmp_path: Path) -> None:
    no_answer = [Sample(id="a", prompt="p")]
    answered = [Sample(id="a", prompt="p", answer="1")]
    path = tmp_path / "x.jsonl"
    assert not reports_accuracy(_cfg(path, "reward.fn=length"), no_answer)
    assert not reports_accuracy(_cfg(path, "reward.fn=tests.rewards_for_tests:token_id_reward"), no_answer)
    assert reports_accuracy(_cfg(path, "reward.fn=length"), answered)
    assert reports_accuracy(_cfg(path, "reward.fn=code"), no_answer)  # grades its tests column
    marked = ["reward.fn=null", "reward.components.mine.fn=length", "reward.components.mine.correctness=true"]
    assert reports_accuracy(_cfg(path, *marked), no_answer)


def test_a_prompt_only_run_logs_columns_and_evaluates_the_reward(
    tmp_path: Path,
    micro_model_dir: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _jsonl(tmp_path / "train.jsonl", _standard(40))
    settings = {
        "data.task": "null",
        "data.source": path,
        "logging.samples": 2,
        "run.eval_every": 1,
        **LENGTH_REWARD,
    }
    with caplog.at_level(logging.INFO, logger="hone"):
        assert main(["train", *tiny_run(tmp_path, micro_model_dir, **settings)]) == 0
    assert sum(NOTE in r.getMessage() for r in caplog.records) == 1  # three evals, one note
    out = capsys.readouterr().out
    assert "held-out reward before RL" in out and "held-out reward after RL" in out
    assert "held-out accuracy" not in out
    evals = [row for row in read_metrics(tmp_path / "r" / "metrics.jsonl") if "eval/reward" in row]
    assert [row["step"] for row in evals] == [0, 1, 2]
    assert not any(k.startswith(("eval/accuracy", "eval/pass@")) for row in evals for k in row)
    records = read_samples(tmp_path / "r" / "samples.jsonl")
    assert len(records) == 4
    for r in records:  # ids are `<file stem>-<row>`: the row the record's columns came from
        i = int(r["sample_id"].removeprefix("train-"))
        assert r["meta"] == {"source": "trl", "level": i % 3, "tags": ["x", f"t{i}"]}

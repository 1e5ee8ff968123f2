"""Turn a model reference from a config (`tiny`, a local path, a hub name) into what `from_pretrained` takes.

Why here and not in the loader: a typo in a local path should fail at once with the path in the message,
not minutes later as a confusing hub 404, and the `tiny` aliases must be built before anything loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hone.models.tiny import build_tiny_model

# Named tiny presets, as `build_tiny_model` keyword arguments; `tiny` alone means `tiny:default`.
TINY_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "llama": {"arch": "llama"},
    "micro": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "head_dim": 32},
}
# Bump when `build_tiny_model` changes what it writes, so stale cached builds are not reused.
_TINY_BUILD_VERSION = 1
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "hone" / "models"


def resolve_model(ref: str, cache_dir: Path | None = None) -> str:
    """Resolve `ref`: `tiny[:preset]` → a cached build; existing directory → itself; `org/name` → as is.

    Aliases win over a same-named directory in the working directory (write `./tiny` for that). A
    reference that looks like a filesystem path but does not exist raises `FileNotFoundError`.
    """
    if ref == "tiny" or ref.startswith("tiny:"):
        return str(_build_tiny_cached(ref.partition(":")[2] or "default", cache_dir or default_cache_dir()))
    path = Path(ref).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise NotADirectoryError(f"model path {ref!r} is a file; expected a model directory")
    if _looks_like_path(ref):
        raise FileNotFoundError(f"model directory not found: {ref}")
    return ref


def _looks_like_path(ref: str) -> bool:
    if ref.startswith(("/", ".", "~")) or "\\" in ref:
        return True
    return os.sep in ref and not _HUB_NAME.fullmatch(ref)


def _build_tiny_cached(preset: str, cache_dir: Path) -> Path:
    if preset not in TINY_PRESETS:
        raise ValueError(f"unknown tiny model preset {preset!r}; choose one of {sorted(TINY_PRESETS)}")
    kwargs = TINY_PRESETS[preset]
    key = json.dumps({"version": _TINY_BUILD_VERSION, **kwargs}, sort_keys=True)
    target = cache_dir / f"tiny-{preset}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    if target.is_dir():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a crash or a concurrent build never leaves a half-written
    # directory where a later run would take it for a finished one.
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_dir))
    try:
        build_tiny_model(tmp, **kwargs)
        tmp.rename(target)
    except OSError:
        if not target.is_dir():  # not a lost race with another builder
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target

"""Crash-safe training checkpoints: named parts (models, optimizers, RNG, trainer and run state) in one
directory.

A checkpoint is built under a hidden temp name, fsynced, and only then renamed to `step-N`. Rename is
atomic, so `latest()` sees either a complete checkpoint or none: a run killed mid-save resumes from
the previous one instead of loading half-written tensors.

A part's name says where it lives, so save and load are one table read both ways: `name/` is a
directory a model writes (`save_pretrained`) and reads back (`load_weights`); `name.pt` a torch file of
`state_dict()` (optimizers, the RNG); any other name a key of `state.json`, holding a `Stateful`'s
JSON-serialisable `state_dict()` or a plain JSON value.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from hone.training.distributed import Ranks

log = logging.getLogger("hone")

CHECKPOINTS = "checkpoints"
MODEL_DIR = "model"
CRITIC_DIR = "critic"  # PPO's value model (trunk + value head), beside the policy's `model/`
SHARDS_DIR = "shards"  # N learner ranks: the policy and its optimizer as DCP shards
CRITIC_SHARDS_DIR = "critic_shards"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TEMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` (and `root` itself) to disk."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@runtime_checkable
class Stateful(Protocol):
    """A part saved as its `state_dict()` (to `name.pt`, or into state.json) and restored in place."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


@runtime_checkable
class Pretrained(Protocol):
    """A part saved as a directory (`name/`): a policy or value model."""

    def save_pretrained(self, directory: Path) -> None: ...

    def load_weights(self, directory: Path) -> None: ...


# A `Stateful`, a `Pretrained` or a plain JSON value (kept in state.json); which one the name says.
Part = Any


class GlobalRNG:
    """The process's random generators (python, numpy, torch CPU and CUDA) as one `Stateful` part: a
    resumed run draws exactly what an uninterrupted one would."""

    def state_dict(self) -> dict[str, Any]:
        state = np.random.get_state()  # legacy=True (the default): the MT19937 tuple
        if not isinstance(state, tuple):
            raise TypeError(f"numpy's legacy RNG state is a {type(state).__name__}, expected a tuple")
        kind, keys, pos, has_gauss, gauss = state
        return {
            "python": random.getstate(),
            # As a tensor, so the file loads with `weights_only=True` (no pickled numpy objects).
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


RNG = GlobalRNG()
RNG_FILE = "rng.pt"


def damage(path: Path) -> str | None:
    """What makes checkpoint `path` unloadable, found cheaply (headers and directories, no tensors
    read), or None. Truncation is what this catches: every safetensors file must cover the length its
    header declares, every `.pt` (a zip archive) must have its central directory, state.json must parse."""
    try:
        json.loads((path / "state.json").read_text())
    except (OSError, ValueError) as e:
        return f"state.json: {e}"
    weights = sorted((path / MODEL_DIR).rglob("*.safetensors"))
    if not weights:
        return f"no *.safetensors under {MODEL_DIR}/"
    weights += sorted((path / CRITIC_DIR).rglob("*.safetensors"))
    for shards in (SHARDS_DIR, CRITIC_SHARDS_DIR):  # DCP's index, written last, after every rank's files
        if (path / shards).is_dir() and not (path / shards / ".metadata").is_file():
            return f"{shards}/ has no .metadata (a save of N ranks that did not finish)"
    for file in weights:
        try:
            with safe_open(file, framework="pt"):
                pass
        except (OSError, SafetensorError) as e:
            return f"{file.relative_to(path)}: {e}"
    for file in sorted(path.glob("*.pt")):
        try:
            with zipfile.ZipFile(file):
                pass
        except (OSError, zipfile.BadZipFile) as e:
            return f"{file.name}: {e}"
    return None


class Checkpointer:
    """Saves `run_dir/checkpoints/step-N/` and restores from it; keeps only the newest `keep_last` if set.

    The loop's parts: `model/` (`Policy.save_pretrained`), `optimizer.pt`, `rng.pt` (`RNG`) and state.json
    (`step`, the trainer's LR-schedule progress under `trainer`, the run's counters); with a critic (PPO)
    also `critic/` (`ValueModel.save_pretrained`), `critic_optimizer.pt` and its trainer state under
    `critic`. One writer per run directory is assumed.

    On N learner ranks every rank calls `save` with the same step and the same file parts in the same
    order (a `name/` part may be a collective: a gather, or DCP shards every rank writes); rank 0 alone
    prepares the temp directory, writes the `.pt` and JSON parts and renames, with a barrier between the
    phases, so the checkpoint appears whole or not at all. The run directory must be one every rank sees
    (a shared filesystem across nodes).
    """

    def __init__(
        self, run_dir: str | Path, *, keep_last: int | None = None, ranks: Ranks | None = None
    ) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        self.root = Path(run_dir) / CHECKPOINTS
        self.keep_last = keep_last
        self.ranks = ranks or Ranks()

    def _complete(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and path.is_dir() and (path / "state.json").is_file():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None. Temp and half-deleted directories are never returned."""
        found = self._complete()
        return found[-1][1] if found else None

    def latest_intact(self) -> Path | None:
        """The newest complete checkpoint whose files are whole, warning about each damaged one skipped
        (a disk filled or a copy cut short after the rename): resuming from the one before is what a kill
        mid-save gives, so the run loses steps, not weights. `ValueError` when every checkpoint is damaged."""
        found = self._complete()
        for _, path in reversed(found):
            problem = damage(path)
            if problem is None:
                return path
            log.warning("checkpoint %s is damaged (%s); trying the one before", path, problem)
        if found:
            raise ValueError(f"every checkpoint in {self.root} is damaged; move them away to start over")
        return None

    def save(self, step: int, parts: dict[str, Part]) -> Path:
        """Write checkpoint `step` of `parts` (see the module doc for where each lives) atomically and
        return its path. The JSON parts must be JSON-serialisable."""
        files = {name: part for name, part in parts.items() if _is_file(name)}
        state = {name: _json_state(part) for name, part in parts.items() if not _is_file(name)}
        if state.get("step", step) != step:
            raise ValueError("the 'step' part conflicts with the step being saved")
        state_json = json.dumps({**state, "step": step}, indent=2)  # fail before touching disk
        lead = self.ranks.rank == 0
        final = self.root / f"step-{step}"
        tmp = self.root / f"{_TEMP_PREFIX}step-{step}"
        if lead:
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()
            tmp.mkdir()
        self.ranks.barrier()
        for name, part in files.items():
            if name.endswith("/"):
                part.save_pretrained(tmp / name.rstrip("/"))
            elif lead:
                torch.save(part.state_dict(), tmp / name)
        self.ranks.barrier()  # every rank's files are written
        if lead:
            (tmp / "state.json").write_text(state_json)
            _fsync_tree(tmp)
            if final.exists():  # re-saving a step (e.g. after resuming from it): retire the old copy first
                self._discard(final)
            tmp.rename(final)
            _fsync_dir(self.root)
            self._prune()
        self.ranks.barrier()  # no rank goes on before the checkpoint is in place
        return final

    def load(self, path: str | Path, parts: dict[str, Part]) -> dict[str, Any]:
        """Restore each `Stateful`/`Pretrained` part from checkpoint `path`, in the order given (the RNG
        last, when it is last: loading a model must not draw after it); return state.json (its plain
        values, `step` among them). A part the checkpoint lacks is a `ValueError` naming it."""
        path = Path(path)
        state = json.loads((path / "state.json").read_text())
        for name, part in parts.items():
            if _is_file(name):
                file = path / name.rstrip("/")
                if not file.exists():
                    raise ValueError(f"{path} holds no {name} (it was saved by a run without one)")
                if name.endswith("/"):
                    part.load_weights(file)
                else:
                    part.load_state_dict(torch.load(file, weights_only=True))
            elif isinstance(part, Stateful):
                if name not in state:
                    raise ValueError(f"{path} holds no {name!r} in state.json")
                part.load_state_dict(state[name])
        return state

    def _discard(self, path: Path) -> None:
        # Rename first so a crash mid-delete leaves a hidden name that `latest()` ignores.
        trash = self.root / f"{_TRASH_PREFIX}{path.name}"
        shutil.rmtree(trash, ignore_errors=True)
        path.rename(trash)
        shutil.rmtree(trash)

    def _remove_leftovers(self) -> None:
        for path in self.root.iterdir():
            if path.name.startswith((_TEMP_PREFIX, _TRASH_PREFIX)):
                shutil.rmtree(path, ignore_errors=True)

    def _prune(self) -> None:
        if self.keep_last is None:
            return
        for _, path in self._complete()[: -self.keep_last]:
            self._discard(path)


def _is_file(name: str) -> bool:
    return name.endswith(("/", ".pt"))


def _json_state(part: Part) -> Any:
    return part.state_dict() if isinstance(part, Stateful) else part

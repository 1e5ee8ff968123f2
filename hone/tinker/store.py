"""Checkpoints of `hone serve tinker` under the server's run directory, and the `tinker://` paths naming them.

`tinker://<model_id>/weights/<name>` (`save_state`: adapter and optimizer state) and
`tinker://<model_id>/sampler_weights/<name>` (`save_weights_for_sampler`: the adapter) are the directories
`<run_dir>/<model_id>/weights/<name>/` and `<run_dir>/<model_id>/sampler_weights/<name>/`. Each holds the
adapter as peft saves one (`adapter_model.safetensors`, `adapter_config.json`: `PeftModel.from_pretrained`
loads it onto the base model), `checkpoint.json` (the base model's name, the LoRA, when it was saved) and,
for training state, `optimizer.pt`. Everything a load needs is in the directory, so a checkpoint loads the
same after the server restarts. A checkpoint is written under a temporary name and renamed into place, so a
crash never leaves half of one under its real name.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from safetensors.torch import load_file, save_file

from hone.tinker.engine import LoraSpec
from hone.tinker.wire import WireError

if TYPE_CHECKING:
    from peft import LoraConfig

Kind = Literal["weights", "sampler_weights"]
KINDS: tuple[Kind, ...] = ("weights", "sampler_weights")
ADAPTER_FILE = "adapter_model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
META_FILE = "checkpoint.json"
RUN_FILE = "run.json"


class Store:
    """The run directory's checkpoints (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def write_run(
        self, model_id: str, base_model: str, lora: LoraSpec, user_metadata: dict[str, Any] | None = None
    ) -> None:
        """Record a training client (for listing runs, and to know its base model after a restart)."""
        folder = self.root / model_id
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "model_id": model_id,
            "base_model": base_model,
            "lora": lora.to_json(),
            "created": time.time(),
            "user_metadata": user_metadata,
        }
        (folder / RUN_FILE).write_text(json.dumps(record, indent=2))

    def save(
        self,
        model_id: str,
        kind: Kind,
        name: str,
        *,
        adapter: dict[str, torch.Tensor],
        config: LoraConfig,
        base_model: str,
        lora: LoraSpec,
        optimizer: dict[str, Any] | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> str:
        """Write a checkpoint; return its tinker:// path."""
        _check_name(name)
        target = self.root / model_id / kind / name
        if target.exists() and not overwrite:
            raise WireError(
                f"checkpoint tinker://{model_id}/{kind}/{name} exists (pass overwrite=True to replace it)"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=target.parent))
        try:
            save_file({k: v.contiguous() for k, v in adapter.items()}, str(tmp / ADAPTER_FILE))
            config.save_pretrained(str(tmp))
            if optimizer is not None:
                torch.save(optimizer, tmp / OPTIMIZER_FILE)
            meta = {
                "model_id": model_id,
                "kind": kind,
                "base_model": base_model,
                "lora": lora.to_json(),
                "time": time.time(),
                "user_metadata": user_metadata,
            }
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return f"tinker://{model_id}/{kind}/{name}"

    def runs(self) -> list[dict[str, Any]]:
        """Every training run's record (`write_run`), newest first, each with `updated`: the time of its
        newest checkpoint, or its creation if it has none."""
        records = [self.run(path.parent.name) for path in self.root.glob(f"*/{RUN_FILE}")]
        return sorted(records, key=lambda r: (-r["created"], r["model_id"]))

    def run(self, model_id: str) -> dict[str, Any]:
        """One training run's record (as `runs` gives it), or a one-line error."""
        path = self.root / model_id / RUN_FILE
        if "/" in model_id or model_id.startswith(".") or not path.is_file():
            raise WireError(f"no training run {model_id!r} in this server's run directory {self.root}")
        record: dict[str, Any] = json.loads(path.read_text())
        times = [c["time"] for c in self.checkpoints(model_id)]
        return {**record, "updated": max([record["created"], *times])}

    def checkpoints(self, model_id: str) -> list[dict[str, Any]]:
        """The run's checkpoints, oldest first: each checkpoint.json's record plus `name`, `tinker_path` and
        `size_bytes` (its files together). Half-written ones (temporary names) are not listed."""
        found = []
        for kind in KINDS:
            for meta in (self.root / model_id / kind).glob(f"[!.]*/{META_FILE}"):
                record = json.loads(meta.read_text())
                name = meta.parent.name
                size = sum(f.stat().st_size for f in meta.parent.iterdir() if f.is_file())
                path = f"tinker://{model_id}/{kind}/{name}"
                found.append({**record, "name": name, "tinker_path": path, "size_bytes": size})
        return sorted(found, key=lambda c: (c["time"], c["tinker_path"]))

    def delete(self, tinker_path: str) -> None:
        """Remove a checkpoint (a one-line error if it is not there)."""
        shutil.rmtree(self.locate(tinker_path))

    def locate(self, tinker_path: str) -> Path:
        """The directory of an existing checkpoint, or a one-line error naming the path."""
        from tinker.types import ParsedCheckpointTinkerPath

        try:
            parsed = ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
        except ValueError as e:
            raise WireError(
                f"{e} (expected tinker://<model_id>/weights/<name> or .../sampler_weights/<name>)"
            ) from e
        kind, _, name = parsed.checkpoint_id.partition("/")
        _check_name(name)
        directory = self.root / parsed.training_run_id / kind / name
        if not (directory / META_FILE).is_file():
            raise WireError(f"no checkpoint {tinker_path} in this server's run directory {self.root}")
        return directory


def read_meta(directory: Path) -> tuple[str, LoraSpec, dict[str, Any]]:
    """(base model, LoRA, the whole record) of a checkpoint directory."""
    meta = json.loads((directory / META_FILE).read_text())
    return meta["base_model"], LoraSpec.from_json(meta["lora"]), meta


def read_adapter(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / ADAPTER_FILE))


def read_optimizer(directory: Path, what: str) -> dict[str, Any]:
    path = directory / OPTIMIZER_FILE
    if not path.is_file():
        raise WireError(f"{what} holds no optimizer state (a sampler checkpoint? save it with save_state)")
    state: dict[str, Any] = torch.load(path, weights_only=True)
    return state


def _check_name(name: str) -> None:
    if not name or "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
        raise WireError(f"checkpoint name {name!r}: use a plain name (no '/', not starting with '.')")

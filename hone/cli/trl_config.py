"""A `trl grpo --config grpo.yaml` file as a Hone recipe: `hone train --trl-config grpo.yaml` (and
`hone config --trl-config`, which only prints it).

The file's flat keys are fields of the four classes TRL's `grpo` script parses it into (its
`GRPOScriptArguments`, `GRPOConfig`, `ModelConfig`, `DatasetMixtureConfig`); their defaults are read
from TRL itself, so the translation (`hone.config.trl.mapping`) sees what `trl grpo` would run. A key
none of them has is refused with the closest field names.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from pathlib import Path
from typing import Any

import yaml

from hone.config import ConfigError, HoneConfig, load_config
from hone.config.trl.mapping import Translation, translate

RECIPE_HEADER = "# The Hone recipe of a TRL config"


@functools.cache
def trl_defaults() -> dict[str, Any]:
    """Every field of `trl grpo`'s four argument classes and its default (TRL's, read from TRL)."""
    try:
        from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig
        from trl.scripts.grpo import GRPOScriptArguments
    except ImportError as e:
        raise ConfigError(f"--trl-config reads TRL's own defaults: pip install trl ({e})") from None
    return {
        name: value
        for cls in (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)
        for name, value in class_defaults(cls).items()
    }


def class_defaults(cls: Any) -> dict[str, Any]:
    """A dataclass's fields and their defaults (a default factory is called), without building it."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = None
    return out


def read_trl_config(path: str | Path) -> Translation:
    """The Hone recipe for the TRL config file at `path`; `ConfigError` for a file TRL would not read or a
    setting Hone cannot honour, naming the key."""
    where = Path(path)
    if not where.is_file():
        raise ConfigError(f"--trl-config {path}: no such file")
    try:
        values = yaml.safe_load(where.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"--trl-config {path}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"--trl-config {path}: expected a mapping of TRL's keys (num_generations: 8, ...)")
    defaults = trl_defaults()
    unknown = [key for key in values if key not in defaults]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), list(defaults), n=3)
            hints.append(f"{key}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise ConfigError(f"--trl-config {path}: not a field of TRL's grpo script: {'; '.join(hints)}")
    try:
        return translate(values, defaults, train_rows=_rows(values))
    except ConfigError as e:
        raise ConfigError(f"--trl-config {path}: {e}") from None


def _rows(values: dict[str, Any]) -> int | None:
    """The training set's length where TRL would run epochs (no `max_steps`) and the data is local."""
    if int(values.get("max_steps", -1) or -1) > 0 or not values.get("dataset_name"):
        return None
    from hone.data.datasets import read_rows
    from hone.data.errors import HoneDataError

    if not Path(str(values["dataset_name"])).expanduser().exists():
        return None  # a hub name: its length is known only once it downloads
    try:
        _, rows = read_rows(str(values["dataset_name"]))
        return sum(1 for _ in rows)
    except HoneDataError:
        return None


def recipe_yaml(translation: Translation, source: str) -> str:
    """The translated recipe as YAML, with what the translation noted as comments above it."""
    lines = [f"{RECIPE_HEADER} ({source}): hone train THIS_FILE, or hone train --trl-config {source}"]
    lines += [f"# note: {note}" for note in translation.notes]
    body = yaml.safe_dump(translation.tree, sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + "\n" + body


def trl_recipe_config(path: str, overrides: list[str]) -> HoneConfig:
    """The recipe a TRL config file asks for, printed (what a Hone recipe of it would say), then loaded
    with `overrides` as any recipe is."""
    import tempfile

    text = recipe_yaml(read_trl_config(path), path)
    print(text, end="", flush=True)
    with tempfile.TemporaryDirectory(prefix="hone-trl-") as folder:
        recipe = Path(folder) / f"{Path(path).stem}.hone.yaml"
        recipe.write_text(text)
        return load_config(recipe, overrides, relative_to=Path.cwd())

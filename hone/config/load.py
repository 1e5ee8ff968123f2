"""Reading a recipe: find it, apply dotted overrides and the algorithm preset, import plugins, validate into
a `HoneConfig`.

Paths are made absolute here: a relative path in a recipe means the recipe's folder (so a recipe runs the
same from any directory), one in an override the current directory; the run's saved `config.yaml` then
records where its data really was. The current directory and the recipe's folder join the import path
(appended: an installed package of the same name still wins), so `reward.fn: myreward:score` finds a
`myreward.py` beside the recipe without PYTHONPATH.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hone.config.aliases import PEER_KEYS
from hone.config.base import ConfigError
from hone.config.checks import run_recipe_checks
from hone.config.keys import sections, suggest
from hone.config.moved import move_legacy_keys, moved_key, note
from hone.config.presets import apply_preset, explicit_over_preset
from hone.config.schema import HoneConfig

RECIPES_DIR = Path(__file__).parents[1] / "recipes"
DEFAULT_RECIPE = RECIPES_DIR / "default.yaml"
_EXPONENT_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")
# Keys naming a local file or directory (or else a hub name or an alias, kept as written).
PATH_KEYS = (
    ("data", "source"),
    ("data", "eval_source"),
    ("sft", "data"),
    ("dpo", "data"),
    ("rm", "data"),
    ("rm", "eval_data"),
    ("model", "path"),
    ("critic", "path"),
    ("distill", "teacher"),
    ("control", "offline", "dataset_root"),
    ("control", "dataset_root"),  # its place before control.offline (`hone.config.moved`)
)
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
# The first line of a run's saved config.yaml: its paths were made absolute when it was written, and any
# relative one left (a run from before that) meant the directory the run was started from.
RUN_CONFIG_HEADER = "# hone run config"

log = logging.getLogger("hone")


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def find_recipe(name_or_path: str | None) -> Path:
    """A recipe file path, or the name of a packaged recipe (`hone train default`)."""
    if name_or_path is None:
        return DEFAULT_RECIPE
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = RECIPES_DIR / f"{name_or_path}.yaml"
    if packaged.is_file():
        return packaged
    section, dot, _ = name_or_path.partition(".")
    if dot and section in HoneConfig.model_fields and not path.suffix.startswith(".y"):
        raise ConfigError(
            f"recipe not found: {name_or_path} looks like a setting; settings are section.key=value words "
            f"after the recipe (hone train [RECIPE] {name_or_path}=VALUE)"
        )
    where = "no such file, nor a packaged recipe" if path.suffix else "no packaged recipe of that name"
    raise ConfigError(f"recipe not found: {name_or_path} ({where}{_closest(path.stem)}; {RECIPES_LISTED})")


RECIPES_LISTED = "hone train --help lists the packaged recipes"


def _closest(name: str) -> str:
    """`, closest: a, b` when some packaged recipe names are near `name` (at most three)."""
    close = difflib.get_close_matches(name, list_recipes(), n=3, cutoff=0.5)
    return f"; closest: {', '.join(close)}" if close else ""


def parse_override(text: str) -> tuple[list[str], Any]:
    """'algorithm.kl.coef=0.01' → (['algorithm', 'kl', 'coef'], 0.01); the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({e.__class__.__name__})") from None
    if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value):
        value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string; users mean a number
    return key.split("."), value


def _set_dotted(tree: dict[str, Any], keys: list[str], value: Any, origin: str) -> None:
    node = tree
    for depth, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:  # absent, or null like a saved `lora: null`: `model.lora.r=8` turns it on
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {'.'.join(keys[: depth + 1])} is not a section")
        node = child
    node[keys[-1]] = value


def _moved(move: Any, tree: dict[str, Any], path: Path) -> list[str]:
    try:
        moved: list[str] = move(tree)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return moved


def _format_error(error: ValidationError, origin: str) -> str:
    """One line: every unknown key with its did-you-mean (a recipe of TRL names may have several), else the
    first error; '(+N more)' counts the errors not shown."""
    errors = error.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    shown = unknown or errors[:1]
    more = f" (+{len(errors) - len(shown)} more)" if len(errors) > len(shown) else ""
    return f"{origin}: " + "; ".join(_error_text(e) for e in shown) + more


def _error_text(error: Any) -> str:
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        msg = "unknown key" + suggest(key, PEER_KEYS)
    elif error["type"] == "model_type" and key in sections():  # `algorithm=rloo`
        msg = f"{key} is a section: set one of its keys ({key}.<key>=value); `hone config` lists them"
    else:
        msg = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:  # a rule across sections: its message names the keys
        return msg
    return f"{key}: {msg}"


def resolve_path(value: str, base: Path) -> str:
    """`value` made absolute against `base` when it names a local file or folder: it exists there, or it
    looks like a file (a data suffix, or `./`, `../`, `~`). A hub name (`openai/gsm8k`), an alias (`tiny`)
    or a `prefix:name` source (`reasoning_gym:chain_sum`) is kept as written."""
    if not value or ":" in value:
        return value
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    candidate = Path(os.path.abspath(base / path))
    looks_local = path.suffix in _FILE_SUFFIXES or value.startswith(("./", "../", "~"))
    return str(candidate) if candidate.exists() or looks_local else value


def _resolve_paths(tree: dict[str, Any], base: Path, only: set[tuple[str, ...]] | None = None) -> None:
    for keys in PATH_KEYS:
        body: Any = tree
        for part in keys[:-1]:
            body = body.get(part) if isinstance(body, dict) else None
        key = keys[-1]
        if (only is None or keys in only) and isinstance(body, dict):
            value = body.get(key)
            # A bare model name is an alias (`tiny`) or a folder of the current directory, as before.
            bare_model = key == "path" and "/" not in str(value) and not str(value).startswith("~")
            if isinstance(value, str) and not bare_model:
                body[key] = resolve_path(value, base)


def _extend_import_path(folders: list[Path]) -> None:
    for folder in folders:
        entry = str(folder.resolve())
        if entry not in sys.path:
            sys.path.append(entry)


def _import_plugins(tree: dict[str, Any]) -> None:
    """Import `run.plugins` before validation, so the names they register are known to it."""
    run = tree.get("run")
    plugins = (run.get("plugins") if isinstance(run, dict) else None) or []  # a bad `run` fails validation
    if not isinstance(plugins, list):
        raise ConfigError("run.plugins: must be a list of module names")
    for module in plugins:
        try:
            importlib.import_module(str(module))
        except Exception as e:  # not only ImportError: a user module may fail in any way as it runs
            raise ConfigError(f"run.plugins: cannot import {module!r}: {type(e).__name__}: {e}") from None


def _read_recipe(path: Path, text: str) -> dict[str, Any]:
    """The recipe's tree of sections; one-line errors for bad YAML, an empty file or a scalar section."""
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else f"{path}"
        problem = getattr(e, "problem", None) or e.__class__.__name__
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    if tree is None:  # almost surely a mistake (a truncated copy, the wrong file), not "all defaults"
        raise ConfigError(
            f"{path}: empty recipe; start from a packaged one: hone config default > {path.name} "
            f"({RECIPES_LISTED})"
        )
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections")
    optional = {name for name, field in HoneConfig.model_fields.items() if field.default is None}
    for section, body in tree.items():
        if body is None and section in optional:  # `critic: null` (as config.yaml saves it): off
            continue
        if body is None:  # `trainer:` with every key commented out: the section's defaults
            tree[section] = {}
        elif not isinstance(body, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping of keys, not {body!r}")
    return tree


def validate_recipe(tree: dict[str, Any], origin: str) -> HoneConfig:
    """The one way a recipe's tree (its keys where they live now, the preset applied) becomes a `HoneConfig`:
    the schema, then every registered check (`hone.config.checks`: the registries the config cannot
    import); a `ConfigError` of one line starting with `origin` for the first problem."""
    try:
        cfg = HoneConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_error(e, origin)) from None
    try:
        run_recipe_checks(cfg)
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}") from None
    return cfg


def load_config(
    recipe: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    relative_to: Path | None = None,
) -> HoneConfig:
    """Load a recipe (default: the embedded one), apply dotted overrides and `algorithm.preset`, validate.

    Relative paths in the recipe resolve against `relative_to` (default: the recipe's folder; a packaged
    recipe's and a run's saved config's against the current directory), those in overrides against the
    current directory."""
    path = find_recipe(str(recipe) if recipe is not None else None)
    packaged = path.resolve().parent == RECIPES_DIR.resolve()
    text = path.read_text()
    from_cwd = packaged or text.startswith(RUN_CONFIG_HEADER)
    base = relative_to or (Path.cwd() if from_cwd else path.resolve().parent)
    tree = _read_recipe(path, text)
    moved = _moved(move_legacy_keys, tree, path)  # the recipe's own old spellings of moved keys
    _resolve_paths(tree, base)
    parsed = [(parse_override(text), text) for text in overrides]
    control = tree.get("control")
    is_control = isinstance(control, dict) or any(keys[0] == "control" for (keys, _), _t in parsed)
    algorithm = str((control or {}).get("algorithm", "ppo")) if isinstance(control, dict) else "ppo"
    algorithm = next((str(v) for (keys, v), _t in parsed if keys == ["control", "algorithm"]), algorithm)
    overridden: set[tuple[str, ...]] = set()
    for (keys, value), text in parsed:
        new = moved_key(keys, algorithm if is_control else None, value)
        if (
            new is not None
        ):  # an old spelling of a moved key: set where it lives now; it wins, as overrides do
            moved.append(note(keys, new, algorithm))
            if not new:
                continue
            keys = new
        _set_dotted(tree, keys, value, f"override {text!r}")
        overridden.add(tuple(keys))
    _resolve_paths(tree, Path.cwd(), only=overridden)
    _extend_import_path([Path.cwd()] if packaged else [Path.cwd(), path.resolve().parent])
    _import_plugins(tree)
    origin = f"{path}" + (" + overrides" if overrides else "")
    if moved:  # still read; the recipe should say it the new way
        log.warning("%s: keys have moved (still read this once): %s", origin, "; ".join(moved))
    try:
        preset_keys = apply_preset(tree)
    except ValueError as e:
        raise ConfigError(f"{origin}: {e}") from None
    cfg = validate_recipe(tree, origin)
    if preset_keys:
        log.info("algorithm.preset %s set %s", cfg.algorithm.preset, ", ".join(preset_keys))
    kept = explicit_over_preset(tree)
    if kept:
        preset = cfg.algorithm.preset
        log.warning("algorithm.preset %s: the recipe's own values win: %s", preset, "; ".join(kept))
    return cfg

"""Reading a recipe: find it, apply dotted overrides, import plugins, validate into a `HoneConfig`."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hone.config.schema import ConfigError, HoneConfig

RECIPES_DIR = Path(__file__).parents[1] / "recipes"
DEFAULT_RECIPE = RECIPES_DIR / "default.yaml"
_EXPONENT_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


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
    raise ConfigError(f"recipe not found: {name_or_path} (packaged recipes: {', '.join(list_recipes())})")


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


def _format_error(error: ValidationError, origin: str) -> str:
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "(top level)"
    msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    more = f" (+{error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{origin}: {key}: {msg}{more}"


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


def _read_recipe(path: Path) -> dict[str, Any]:
    """The recipe's tree of sections; one-line errors for bad YAML, an empty file or a scalar section."""
    try:
        tree = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else f"{path}"
        problem = getattr(e, "problem", None) or e.__class__.__name__
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    if tree is None:  # almost surely a mistake (a truncated copy, the wrong file), not "all defaults"
        raise ConfigError(f"{path}: empty recipe; start from a packaged one ({', '.join(list_recipes())})")
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


def load_config(recipe: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> HoneConfig:
    """Load a recipe (default: the embedded one), apply dotted overrides, validate."""
    path = find_recipe(str(recipe) if recipe is not None else None)
    tree = _read_recipe(path)
    for text in overrides:
        keys, value = parse_override(text)
        _set_dotted(tree, keys, value, f"override {text!r}")
    _import_plugins(tree)
    try:
        return HoneConfig.model_validate(tree)
    except ValidationError as e:
        origin = f"{path}" + (" + overrides" if overrides else "")
        raise ConfigError(_format_error(e, origin)) from None

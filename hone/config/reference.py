"""The config explained: the resolved recipe as commented YAML (`hone config`), the key reference as Markdown
(`docs/reference/config.md`, generated: `hone config --markdown`) and a JSON schema for YAML editors
(`hone config --schema`). All three are read off the schema, so none can drift from it."""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import BaseModel

from hone.config.keys import Key, iter_keys, section_of, type_name
from hone.config.schema import HoneConfig

CHANGED = "*"  # marks a value that differs from its key's default


def _flow(value: Any) -> str:
    """One YAML value on one line (flow style), as `yaml.safe_load` reads it back."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _default(field: Any) -> Any:
    return Key("", field, BaseModel).default


def _dumped_default(field: Any) -> Any:
    default = _default(field)
    return default.model_dump(mode="json") if isinstance(default, BaseModel) else _jsonable(default)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str)) if isinstance(value, (tuple, list, dict)) else value


def commented_yaml(cfg: HoneConfig, header: list[str] | None = None) -> str:
    """`cfg` as YAML with each key's description in a comment above it and `# *` after a value that is not
    the key's default; `yaml.safe_load` of the text gives `cfg.model_dump(mode="json")` back (a control
    run's: `cfg.to_yaml()`, the sections it reads)."""
    lines = [f"# {line}" for line in header or []]
    lines.append(f"# `{CHANGED}` after a value: differs from the key's default")
    values = cfg.model_dump(mode="json")
    if cfg.control is not None:  # a control run reads these only (`HoneConfig.to_yaml`): the rest is noise
        values = yaml.safe_load(cfg.to_yaml())
        lines.append("# a control run: only what it reads (run, model.path, data.source, logging, control)")
    _section(HoneConfig, values, 0, lines, sparse=cfg.control is not None)
    return "\n".join(lines) + "\n"


def _section(
    model: type[BaseModel], values: dict[str, Any], depth: int, lines: list[str], sparse: bool = False
) -> None:
    """`sparse`: only the keys `values` holds (a control run's config)."""
    pad = "  " * depth
    for name, field in model.model_fields.items():
        if sparse and name not in values:
            continue
        value = values.get(name)
        inner, many = section_of(field.annotation)
        if field.description:
            lines.append(f"{pad}# {field.description}")
        if inner is not None and isinstance(value, dict) and value:
            lines.append(f"{pad}{name}:")
            if many:  # named entries (reward.components.<name>): each one a section
                for entry, body in value.items():
                    lines.append(f"{pad}  {_flow(entry)}:")
                    _section(inner, body, depth + 2, lines, sparse)
            else:
                _section(inner, value, depth + 1, lines, sparse)
            continue
        mark = "" if value == _dumped_default(field) else f"  # {CHANGED}"
        lines.append(f"{pad}{name}: {_flow(value)}{mark}")


def markdown_reference() -> str:
    """Every key: one table per section (key, type, default, description)."""
    out = [
        "# Config reference",
        "",
        "<!-- Generated from hone/config/sections/ by `hone config --markdown`; a test fails when it is "
        "stale. Do not edit by hand. -->",
        "",
        "Every key of a recipe, by section. Set one in a recipe file or on the command line as "
        "`section.key=value`; `hone config RECIPE [overrides]` prints the resolved config with these "
        "descriptions. Values are YAML.",
    ]
    section = None
    for key in iter_keys():
        head = key.name.split(".", 1)[0]
        if head != section:
            section = head
            doc = (HoneConfig.model_fields[head].description or "").strip()
            out += ["", f"## `{head}`", ""] + ([doc, ""] if doc else [])
            out += ["| key | type | default | description |", "|---|---|---|---|"]
        default = "required" if key.required else f"`{_flow(_jsonable(key.default))}`"
        desc = key.description.replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{key.name}` | {_cell(type_name(key.field.annotation))} | {_cell(default)} | {desc} |")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def json_schema() -> str:
    """The recipe's JSON schema (for YAML editors: `# yaml-language-server: $schema=<path>`)."""
    schema = HoneConfig.model_json_schema()
    schema["title"] = "Hone recipe"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"

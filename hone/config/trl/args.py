"""A TRL config's fields as the translators read them (`TrlArgs`), and what they write (`Translation`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_MISSING = object()


@dataclass
class Translation:
    """The Hone recipe a TRL config asks for (`tree`, sections of keys), and what was said about it."""

    tree: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any) -> None:
        section, _, name = key.partition(".")
        node = self.tree.setdefault(section, {})
        for part in name.split(".")[:-1]:
            node = node.setdefault(part, {})
        node[name.split(".")[-1]] = value

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.tree
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


@dataclass
class TrlArgs:
    """Every field's value, TRL's defaults, and the field whose handler is running (for its messages)."""

    values: dict[str, Any]
    defaults: dict[str, Any]
    train_rows: int | None = None
    env_rewards: bool = False  # an environment scores the episodes (TRL's `get_reward`)
    field: str = ""

    def __getitem__(self, name: str) -> Any:
        return self.values.get(name)

    def set_by_user(self, name: str) -> bool:
        return name in self.values and self.values[name] != self.defaults.get(name, _MISSING)

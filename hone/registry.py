"""Name → object registries (algorithms, rewards, environments, tool-call parsers, engines, tasks,
schedulers, placements), so a recipe picks one by name and a new one is one decorator or one line. A leaf
module: every package may import it, it imports none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class Registry(dict[str, V], Generic[V]):
    """A dict of named entries (functions, classes, or `pkg.mod:attr` paths with what they declare)
    whose missing-key error is one line listing what is registered."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def add(self, name: str, entry: V) -> V:
        """Register `entry` as `name`; a second entry under one name is a `ValueError` (a plugin that
        would silently replace a built-in)."""
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self[name] = entry
        return entry

    def register(self, name: str) -> Callable[[V], V]:
        """`add` as a decorator."""
        return lambda entry: self.add(name, entry)

    def check(self, name: str) -> str:
        """`name` if registered; otherwise the missing-key line as a `ValueError` (what a config
        validator raises)."""
        if name not in self:
            raise ValueError(self.unknown(name))
        return name

    def unknown(self, name: str) -> str:
        return f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self))}"

    def __missing__(self, name: str) -> V:
        raise KeyError(self.unknown(name))

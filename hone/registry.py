"""Name → object registries (algorithms, rewards, environments, tool-call parsers), so a recipe picks one by
name and a new one is one decorator. A leaf module: every package may import it, it imports none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F")


class Registry(dict[str, F], Generic[F]):
    """A dict of named functions (or descriptions: a control algorithm's parts) whose missing-key error
    lists what is registered."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[F], F]:
        def decorator(fn: F) -> F:
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self[name] = fn
            return fn

        return decorator

    def __missing__(self, name: str) -> F:
        raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self))}")

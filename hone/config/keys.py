"""Every key of the config, walked from the schema: what the reference, `hone config` and "did you mean"
read, so none of them can drift from the sections themselves."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from hone.config.schema import HoneConfig


@dataclass(frozen=True)
class Key:
    """One leaf key (`trainer.lr`) or a dict-valued section entry (`reward.components.<name>.fn`)."""

    name: str
    field: FieldInfo
    section: type[BaseModel]

    @property
    def description(self) -> str:
        return self.field.description or ""

    @property
    def default(self) -> Any:
        if self.field.default_factory is not None:
            return self.field.default_factory()  # type: ignore[call-arg]
        return None if self.field.default is PydanticUndefined else self.field.default

    @property
    def required(self) -> bool:
        return self.field.is_required()

    @property
    def type_name(self) -> str:
        return type_name(self.field.annotation)


def section_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section model an annotation holds (`X`, `X | None`, `dict[str, X]`), and whether it is a dict of
    them (named entries, `reward.components.<name>`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is dict and len(args) == 2:
        inner, _ = section_of(args[1])
        return inner, inner is not None
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            inner, many = section_of(arg)
            if inner is not None:
                return inner, many
    return None, False


def iter_keys(model: type[BaseModel] = HoneConfig, prefix: str = "") -> Iterator[Key]:
    """The leaf keys of `model`, depth first in declaration order (a recipe's order)."""
    for name, field in model.model_fields.items():
        inner, many = section_of(field.annotation)
        if inner is None:
            yield Key(prefix + name, field, model)
        else:
            yield from iter_keys(inner, f"{prefix}{name}.{'<name>.' if many else ''}")


@cache
def sections() -> dict[str, FieldInfo]:
    """The section keys (`algorithm`, `algorithm.kl`, `model.lora`...) and their fields."""
    found: dict[str, FieldInfo] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            inner, many = section_of(field.annotation)
            if inner is not None:
                found[prefix + name] = field
                walk(inner, f"{prefix}{name}.{'<name>.' if many else ''}")

    walk(HoneConfig, "")
    return found


@cache
def key_names() -> tuple[str, ...]:
    return tuple(key.name for key in iter_keys())


def type_name(annotation: Any) -> str:
    """`int | None` → 'int | null', `Literal['a', 'b']` → 'a | b', `list[str]` → 'list[str]'."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if annotation is type(None):
        return "null"
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(annotation, "__name__", str(annotation))


def suggest(dotted: str, peer_keys: dict[str, tuple[str, str]]) -> str:
    """'; did you mean …?' for an unknown key, naming every candidate (`candidates`); '' when none."""
    close, note = candidates(dotted, peer_keys)
    if not close:
        return ""
    return f"; did you mean {' or '.join(close)}?" + (f" {note}" if note else "")


def candidates(
    dotted: str, peer_keys: dict[str, tuple[str, str]], *, fuzzy: bool = True
) -> tuple[list[str], str]:
    """The Hone keys an unknown key may mean, and a note on them: a peer's spelling (TRL, verl, OpenRLHF) by
    its last part (its note in parentheses), else the Hone keys of the same last part, else (`fuzzy`) the
    closest by the whole name, then by the last part, with no note; ([], "") when nothing is close."""
    last = dotted.rsplit(".", 1)[-1]
    if last in peer_keys:
        hone_key, note = peer_keys[last]
        return [hone_key], (note if "(" in note else f"({note})")
    names = key_names()
    close = [name for name in names if name.rsplit(".", 1)[-1] == last]  # `rollout.lr`: trainer.lr...
    if not fuzzy:
        return close, ""
    close = close or difflib.get_close_matches(dotted, names, n=3, cutoff=0.75)
    if not close:  # `rollout.learning_rate`: the last part alone, same-section keys first
        lasts = sorted({name.rsplit(".", 1)[-1] for name in names})
        matches = difflib.get_close_matches(last, lasts, n=2, cutoff=0.75)
        close = [name for match in matches for name in names if name.rsplit(".", 1)[-1] == match]
        close.sort(key=lambda name: not name.startswith(dotted.split(".", 1)[0] + "."))
    return close, ""

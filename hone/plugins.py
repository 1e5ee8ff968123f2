"""The one loader of user code named by a `pkg.mod:attr` spec (a reward, an environment, an agent, a
data scheduler, an OpenEnv action function...), so every such key fails the same way: one line naming
the key, the spec and the import's own error. What the object must be (callable, a class, an async
function) is each caller's check, with its own wording."""

from __future__ import annotations

import importlib
from typing import Any

from hone.errors import PluginError


def load_object(spec: str, *, what: str) -> Any:
    """The attribute `attr` of module `pkg.mod` that `spec` (`pkg.mod:attr`) names.

    `script:<name>` is an object a Python program registered (`register_script_object`).
    `what` names the key in the error (e.g. "reward 'acc' (fn 'x.y:z')"). Any failure of the import is
    caught, not only `ImportError`: a user's module may raise anything as it is imported (a syntax error,
    a missing file it opens), and the run must still end in one line, not a traceback.
    """
    if spec.startswith(SCRIPT_PREFIX):
        return _script_object(spec, what)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{what}: expected 'pkg.module:name', got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except Exception as e:
        raise PluginError(
            f"{what}: cannot import {attr!r} from {module_name!r}: {type(e).__name__}: {e}"
        ) from e


# Objects a Python program hands Hone directly (`hone.trl.GRPOTrainer(reward_funcs=[my_fn])`), named so a
# recipe can say them: `script:<name>`. They exist only in the process that registered them and in the Ray
# actors it starts (which receive the table with their arguments), never in a recipe file alone.
SCRIPT_PREFIX = "script:"
_SCRIPT_OBJECTS: dict[str, Any] = {}


def register_script_object(name: str, obj: Any) -> str:
    """Register `obj` as `script:<name>` (replacing one of that name) and return that spec."""
    _SCRIPT_OBJECTS[name] = obj
    return SCRIPT_PREFIX + name


def spec_for(obj: Any, name: str) -> str:
    """How a recipe names `obj`: `pkg.mod:attr` when importing that gives back this very object (so a Ray
    actor or a resumed run finds it by name), else `script:<name>`, registered as this program's own (a
    `__main__` function, a lambda, a `partial`, a callable instance)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and module != "__main__" and qualname and "." not in qualname and "<" not in qualname:
        try:
            if getattr(importlib.import_module(module), qualname) is obj:
                return f"{module}:{qualname}"
        except Exception:  # not importable by its name: this program's object
            pass
    return register_script_object(name, obj)


def script_objects() -> dict[str, Any]:
    """The registered objects, for a Ray actor's start (`adopt_script_objects` there)."""
    return dict(_SCRIPT_OBJECTS)


def adopt_script_objects(objects: dict[str, Any]) -> None:
    """Make another process's registered objects resolvable here (a Ray actor of its run)."""
    _SCRIPT_OBJECTS.update(objects)


def _script_object(spec: str, what: str) -> Any:
    name = spec.removeprefix(SCRIPT_PREFIX)
    if name not in _SCRIPT_OBJECTS:
        raise PluginError(
            f"{what}: {spec!r} names an object a Python program registers (hone.trl.GRPOTrainer does), and "
            "none of that name is registered in this process; run the program, or name the object by "
            "'pkg.mod:attr'"
        )
    return _SCRIPT_OBJECTS[name]

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

    `what` names the key in the error (e.g. "reward 'acc' (fn 'x.y:z')"). Any failure of the import is
    caught, not only `ImportError`: a user's module may raise anything as it is imported (a syntax error,
    a missing file it opens), and the run must still end in one line, not a traceback.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{what}: expected 'pkg.module:name', got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except Exception as e:
        raise PluginError(
            f"{what}: cannot import {attr!r} from {module_name!r}: {type(e).__name__}: {e}"
        ) from e

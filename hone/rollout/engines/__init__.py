"""The generation engines a run can sample with (`rollout.engine`), by name.

A new engine (say SGLang) is one module defining an `Engine` (`build` a `Sampler`, name its
`weight_source`, declare its `capabilities`) and one `register_engine` line here (or in a plugin). The
registry names each engine's class as `pkg.mod:Class`, imported only when a run builds that engine, and
repeats what it declares (`EngineCapabilities`): validating a recipe (`rollout.engine`, and the keys only
some engines honour: `rollout.dtype`, `rollout.interruptible`) imports no engine (transformers, a vLLM
client), so a typo still fails in a second.
"""

from __future__ import annotations

from dataclasses import dataclass

from hone.plugins import load_object
from hone.registry import Registry
from hone.rollout.engines.base import Engine, EngineCapabilities, ModelFiles, TrainedModel, WeightSource


@dataclass(frozen=True)
class RegisteredEngine:
    """A registry line: where the engine's class is (`pkg.mod:Class`) and what it declares."""

    path: str
    capabilities: EngineCapabilities


ENGINES: Registry[RegisteredEngine] = Registry("engine")


def register_engine(name: str, path: str, capabilities: EngineCapabilities) -> None:
    """Make the `Engine` class at `path` (`pkg.mod:Class`, imported when a run builds it) the engine
    `rollout.engine: name`; `capabilities` must equal its class's `capabilities` (`get_engine` checks)."""
    ENGINES.add(name, RegisteredEngine(path, capabilities))


# transformers, in this process
register_engine(
    "hf",
    "hone.rollout.engines.hf_engine:HFEngine",
    EngineCapabilities(interruptible=True, dtype_override=True, fingerprint=True),
)
# a vLLM server in its own environment
register_engine("vllm", "hone.rollout.engines.vllm:VLLMEngine", EngineCapabilities(fingerprint=True))


def check_engine(name: str) -> str:
    """`name` if an engine is registered by it; a one-line `ValueError` naming the known ones otherwise."""
    return ENGINES.check(name)


def engine_capabilities(name: str) -> EngineCapabilities:
    """What the engine registered as `name` declares, read from its registry line (no import)."""
    return ENGINES[check_engine(name)].capabilities


def get_engine(name: str) -> Engine:
    """The engine registered as `name` (`rollout.engine`)."""
    entry = ENGINES[check_engine(name)]
    engine: Engine = load_object(entry.path, what=f"rollout.engine {name!r}")()
    declared = getattr(engine, "capabilities", None)  # a third-party class may lack it: say so, not crash
    if declared != entry.capabilities:
        raise ValueError(
            f"rollout.engine {name!r}: {entry.path} declares capabilities {declared} but is registered "
            f"with {entry.capabilities}; make the two agree"
        )
    return engine


__all__ = [
    "ENGINES",
    "Engine",
    "EngineCapabilities",
    "ModelFiles",
    "RegisteredEngine",
    "TrainedModel",
    "WeightSource",
    "check_engine",
    "engine_capabilities",
    "get_engine",
    "register_engine",
]

"""The generation engines a run can sample with (`rollout.engine`), by name.

A new engine (say SGLang) is one module defining an `Engine` (`build` a `Sampler`, name its
`weight_source`) and one line here. The registry names each engine's class as `pkg.mod:Class`,
imported only when a run builds that engine: validating `rollout.engine` in a recipe imports no
engine (transformers, a vLLM client), so a typo still fails in a second.
"""

from __future__ import annotations

from hone.plugins import load_object
from hone.rollout.engines.base import Engine, TrainedModel, WeightSource

ENGINES: dict[str, str] = {
    "hf": "hone.rollout.engines.hf:HFEngine",  # transformers, in this process
    "vllm": "hone.rollout.engines.vllm:VLLMEngine",  # a vLLM server in its own environment
}


def check_engine(name: str) -> str:
    """`name` if an engine is registered by it; a one-line `ValueError` naming the known ones otherwise."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; registered: {', '.join(sorted(ENGINES))}")
    return name


def get_engine(name: str) -> Engine:
    """The engine registered as `name` (`rollout.engine`)."""
    engine: Engine = load_object(ENGINES[check_engine(name)], what=f"rollout.engine {name!r}")()
    return engine


__all__ = ["ENGINES", "Engine", "TrainedModel", "WeightSource", "check_engine", "get_engine"]

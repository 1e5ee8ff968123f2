"""The placement registry (`cluster.backend`): what a backend declares (`BackendCapabilities`), not its
name, decides which recipes it takes, a recipe's backend is built by its registered factory, and every
name registry (engines, backends, schedulers, tasks, environment families) misses with one line naming
what is registered."""

from __future__ import annotations

from typing import Any

import pytest

from hone.config import ConfigError, load_config
from hone.data.schedulers import SCHEDULERS
from hone.data.tasks import TASKS
from hone.envs.base import ENV_FAMILIES
from hone.registry import Registry
from hone.rl.placement.backends import BACKENDS, BackendCapabilities, RegisteredBackend
from hone.rl.placement.build import executor
from hone.rollout.engines import ENGINES

BUILT: list[tuple[Any, Any, Any]] = []


def remote_executor(cfg: Any, parts: Any, replay: Any) -> str:
    """A backend's executor factory, as its registry line names it."""
    BUILT.append((cfg, parts, replay))
    return "the remote executor"


REMOTE = RegisteredBackend("tests.test_backends:remote_executor", BackendCapabilities())


def test_an_unknown_backend_is_one_line_naming_the_registered_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"cluster\.backend: unknown backend 'remote'; registered: local, ray$"
    ):
        load_config(None, ["cluster.backend=remote"])


def test_a_registered_backend_is_built_by_its_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "remote", REMOTE)
    monkeypatch.setattr("tests.test_backends.BUILT", [])
    cfg = load_config(None, ["cluster.backend=remote"])
    parts: Any = object()  # the factory is handed the run's parts untouched
    assert executor(cfg, parts) == "the remote executor"
    assert [(cfg, parts, None)] == BUILT


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("algorithm.replay.enabled=true", r"algorithm\.replay needs one local producer"),
        ("rollout.agent=pkg.mod:run", r"rollout\.agent needs one local producer"),
    ],
)
def test_one_producer_keys_follow_what_the_backend_declares(
    monkeypatch: pytest.MonkeyPatch, setting: str, message: str
) -> None:
    monkeypatch.setitem(BACKENDS, "remote", REMOTE)
    with pytest.raises(ConfigError, match=message + r" \(cluster\.producers: 1, cluster\.backend: local\)"):
        load_config(None, ["cluster.backend=remote", setting])
    one_producer = RegisteredBackend(REMOTE.executor, BackendCapabilities(single_producer=True))
    monkeypatch.setitem(BACKENDS, "remote", one_producer)
    assert load_config(None, ["cluster.backend=remote", setting]).cluster.backend == "remote"
    with pytest.raises(
        ConfigError, match=message + r" \(cluster\.producers: 1, cluster\.backend: local \| remote\)"
    ):
        load_config(None, ["cluster.backend=remote", "cluster.mode=async", "cluster.producers=2", setting])


def test_rollout_interruptible_follows_what_the_backend_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = ["cluster.backend=remote", "cluster.mode=async", "rollout.interruptible=true"]
    monkeypatch.setitem(BACKENDS, "remote", REMOTE)
    with pytest.raises(ConfigError, match=r"rollout\.interruptible needs .* cluster\.backend: local \("):
        load_config(None, recipe)
    monkeypatch.setitem(
        BACKENDS, "remote", RegisteredBackend(REMOTE.executor, BackendCapabilities(interruptible=True))
    )
    assert load_config(None, recipe).rollout.interruptible


@pytest.mark.parametrize(
    ("registry", "kind"),
    [
        (ENGINES, "engine"),
        (BACKENDS, "backend"),
        (SCHEDULERS, "scheduler"),
        (TASKS, "task"),
        (ENV_FAMILIES, "environment family"),
    ],
)
def test_every_name_registry_misses_with_one_line(registry: Registry[Any], kind: str) -> None:
    assert isinstance(registry, Registry)
    names = ", ".join(sorted(registry))
    with pytest.raises(KeyError) as err:
        registry["nope"]
    assert err.value.args == (f"unknown {kind} 'nope'; registered: {names}",)
    with pytest.raises(ValueError, match=f"^unknown {kind} 'nope'; registered: {names}$"):
        registry.check("nope")
    first = next(iter(registry))
    with pytest.raises(ValueError, match=f"^{kind} {first!r} is already registered$"):
        registry.add(first, registry[first])

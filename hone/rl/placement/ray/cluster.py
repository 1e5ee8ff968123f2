"""Ray attach/start/teardown and placement (`cluster.backend: ray`), apart from what runs on the actors.

`ray_session` attaches to `cluster.address` (or `RAY_ADDRESS`) or starts a local Ray, and shuts down a
Ray it started however the run ends (an attached cluster is left running). `place` puts a role's actors
in one PACK placement group; a cluster that cannot host them is one line naming the request and what is
available, and nothing of the request is left behind.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from hone.config import ClusterConfig, LearnerRoleConfig
from hone.errors import HoneError

log = logging.getLogger("hone")


class RayClusterError(HoneError, RuntimeError):
    """The cluster could not host or keep the actors the recipe asks for; one line."""


def bundle(num_cpus: float, num_gpus: float, resources: dict[str, float]) -> dict[str, float]:
    """One actor's Ray resources, as a placement-group bundle."""
    return {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {}), **resources}


def place(
    cls: type,
    count: int,
    request: dict[str, float],
    role: str,
    timeout: float,
    *args: Any,
    restarts: int = -1,
) -> tuple[list[Any], Any]:
    """`count` actors of `cls`, one per bundle of a PACK placement group (a role's actors land together),
    and the group; a cluster that cannot host them within `timeout` seconds is one line (and nothing of
    this call is left)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([dict(request)] * count, strategy="PACK")
    remote: Any = ray.remote(cls)
    actors: list[Any] = []
    try:
        try:
            ray.get(group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            available = {k: v for k, v in ray.available_resources().items() if not k.startswith("node:")}
            raise RayClusterError(
                f"the Ray cluster cannot place {count} {role}(s) of {request} each within {timeout:g} s "
                f"(cluster.start_timeout_s); available: {available}"
            ) from None
        actors = [
            remote.options(
                num_cpus=request.get("CPU", 1),
                num_gpus=request.get("GPU", 0),
                resources={k: v for k, v in request.items() if k not in ("CPU", "GPU")},
                max_restarts=restarts,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=k),
            ).remote(*args)
            for k in range(count)
        ]
        try:
            ray.get([a.pid.remote() for a in actors], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RayClusterError(
                f"{count} {role}(s) were placed but did not start within {timeout:g} s "
                "(cluster.start_timeout_s; a worker imports torch and builds its role first)"
            ) from None
    except BaseException:
        remove(actors, [group])
        raise
    return actors, group


def remove(actors: list[Any], groups: list[Any]) -> None:
    """Kill `actors` (for good: no restart) and remove their placement groups; what is gone already is
    skipped."""
    import ray
    from ray.util.placement_group import remove_placement_group

    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
    for group in groups:
        with contextlib.suppress(Exception):
            remove_placement_group(group)


def await_restart(actor: Any, role: str, timeout: float) -> None:
    """Wait until Ray has a died actor back (calls made before it is would fail again)."""
    import ray

    deadline = time.monotonic() + timeout
    while True:
        try:
            ray.get(actor.pid.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise RayClusterError(
                    f"{role} died and was not restarted within {timeout:g} s (cluster.start_timeout_s)"
                ) from None
            time.sleep(0.5)  # Ray reports no event for "restarted": ask again


def _local_cpus(cluster: ClusterConfig, learner_ranks: int = 1) -> int:
    """Logical CPUs for a Ray instance this run starts: the machine's, or what the recipe's actors reserve
    if more (on a laptop the roles then share its cores, as a local run's threads do)."""
    wanted = cluster.samplers.count * cluster.samplers.num_cpus
    wanted += cluster.reward_workers.count * cluster.reward_workers.num_cpus
    wanted += (learner_ranks - 1) * cluster.learner.num_cpus
    return max(os.cpu_count() or 1, math.ceil(wanted))


@contextlib.contextmanager
def ray_session(cluster: ClusterConfig, learner_ranks: int = 1) -> Iterator[None]:
    """Ray for the run: attach to `cluster.address` (or `RAY_ADDRESS`) or start a local instance, which is
    shut down at the end, whatever the end (Ctrl-C, SIGTERM, an error). An already initialised Ray (a
    test's, a notebook's) is used as it is and left running. `learner_ranks`: `trainer.world_size` (ranks
    1..N-1 are actors with `cluster.learner`'s resources each)."""
    import ray

    if learner_ranks == 1 and cluster.learner != LearnerRoleConfig.model_validate({}):
        log.warning(
            "cluster.learner is ignored with one learner rank: the learner runs in the driver process (with "
            "`ray job submit`, give it resources with --entrypoint-num-cpus/-num-gpus/-resources); it sets "
            "the resources of ranks 1..N-1 when trainer.world_size is N > 1"
        )
    address = cluster.address or os.environ.get("RAY_ADDRESS")
    started = False
    on_sigterm = signal.getsignal(signal.SIGTERM)
    if not ray.is_initialized():
        if address:
            _check_reachable(address)
            try:
                ray.init(address=address)
            except (ConnectionError, RuntimeError) as e:
                raise RayClusterError(
                    f"cannot attach to the Ray cluster at {address} (cluster.address or RAY_ADDRESS): "
                    f"{' '.join(str(e).split())[:200]}; a cluster with token authentication (the default "
                    "of `ray start` since Ray 2.5x) also needs RAY_AUTH_MODE=token here, with its token in "
                    "~/.ray/auth_token or RAY_AUTH_TOKEN"
                ) from None
        else:
            ray.init(include_dashboard=False, num_cpus=_local_cpus(cluster, learner_ranks))
            started = True
    if threading.current_thread() is threading.main_thread() and on_sigterm is not None:
        # `ray.init` puts its own SIGTERM handler (`sys.exit`) over the run's: keep the run's, so SIGTERM
        # ends a Ray run as Ctrl-C does (one line, its actors removed), not by an abort at exit.
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """A `host:port` that takes no TCP connection is one line at once: `ray.init` would retry it for
    minutes. (`auto` and `ray://` addresses are left to Ray.)"""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise RayClusterError(
            f"cannot attach to the Ray cluster at {address} (cluster.address or RAY_ADDRESS): {e}"
        ) from None

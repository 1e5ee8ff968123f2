"""N learner ranks on Ray (`cluster.backend: ray`, `trainer.world_size: N`): the driver is rank 0, and
ranks 1..N-1 are actors in one PACK placement group (`cluster.learner`: CPUs, GPUs and resources per
rank), each running `learner_ranks.follow` as a local follower rank does.

The driver sets up the rendezvous (verl's and OpenRLHF's way): it picks its node's address and a free
port, hands them to the actors, and joins as rank 0; every rank's process group is gloo (CPU) or NCCL
(GPU) as locally. A follower rank that raises or whose actor dies breaks the driver's next collective; the
driver then names that rank in one line (with where the run stopped), and the group's actors and
placement group are removed however the run ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hone.config import HoneConfig
from hone.plugins import script_objects
from hone.rl.placement.ray.actors import enter
from hone.rl.placement.ray.cluster import RayClusterError, bundle, place, remove
from hone.rl.ranks.launch import free_port
from hone.rl.ranks.learners import follow, start_ranks
from hone.run.lifecycle import where_stopped
from hone.training.distributed import Ranks


class LearnerRankActor:
    """One learner rank other than 0, on a Ray worker."""

    def __init__(self, cwd: str, threads: int, objects: dict[str, Any]) -> None:
        enter(cwd, threads, objects)

    def __repr__(self) -> str:  # Ray prefixes the lines it forwards to the driver with this
        return "learner"

    def pid(self) -> int:
        return os.getpid()

    def follow(self, recipe: dict[str, Any], rank: int, world: int, rendezvous: str) -> None:
        cfg = HoneConfig.model_validate(recipe)
        ranks = Ranks(rank, world)
        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
        )  # its GPU: the one Ray gave it
        start_ranks(cfg, ranks, init_method=rendezvous)
        try:
            follow(cfg, ranks)
        finally:
            dist.destroy_process_group()


@contextlib.contextmanager
def learner_group(cfg: HoneConfig) -> Iterator[Ranks]:
    """Ranks 1..N-1 placed and following; this process joined as rank 0 (yielded). On the way out the
    followers have ended (`stop`) or are killed, and their placement group is gone."""
    import ray

    world = cfg.trainer.world_size
    role = cfg.cluster.learner
    request = bundle(role.num_cpus, role.num_gpus, role.resources)
    threads = max(1, int(role.num_cpus))
    actors, group = place(
        LearnerRankActor,
        world - 1,
        request,
        "learner rank",
        cfg.cluster.start_timeout_s,
        os.getcwd(),
        threads,
        script_objects(),  # a program's own objects its recipe names (hone.trl), as the samplers get them
        restarts=0,
    )
    rendezvous = f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"
    recipe = cfg.model_dump(mode="json")
    runs = [actor.follow.remote(recipe, k, world, rendezvous) for k, actor in enumerate(actors, start=1)]
    try:
        ranks = Ranks(0, world)
        start_ranks(cfg, ranks, init_method=rendezvous)
        try:
            yield ranks
            ray.get(runs, timeout=cfg.trainer.collective_timeout_s)  # they end on rank 0's `stop`
        except Exception as e:
            failed = _failed_rank(runs)
            if failed is None:
                raise
            run_dir = Path(cfg.run.dir) / cfg.run.name
            raise RayClusterError(f"{failed}; {where_stopped(run_dir)}") from e
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    finally:
        remove(actors, [group])


def _failed_rank(runs: list[Any]) -> str | None:
    """'learner rank k of N: what happened' for the first follower that raised or died, if one did."""
    import ray

    world = len(runs) + 1
    done, _ = ray.wait(runs, num_returns=len(runs), timeout=2.0)
    for k, run in enumerate(runs, start=1):
        if run not in done:
            continue
        try:
            ray.get(run, timeout=0)
        except ray.exceptions.RayActorError:
            return f"learner rank {k} of {world}: its actor died"
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if e.cause is not None else e
            line = " ".join(str(cause).split())[:300]
            return f"learner rank {k} of {world}: {type(cause).__name__}: {line}"
    return None

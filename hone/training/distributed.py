"""N learner ranks: which rows of an optimizer step each rank trains, and the one place a model is wrapped.

The numerics are those of one process (the approach of prime-rl and AReaL, measured for Hone in
`../shared/research/distributed-learner.md`): every rank holds the whole step's batch and draws the same
mini-batch order; a rank trains its `share` of each mini-batch, and every loss is divided by the counts
of the *whole* mini-batch (as on one rank), so no count needs a collective. PyTorch averages gradients
over ranks; each rank's loss is multiplied by the world size (`Ranks.weigh`) to make that average the
sum one process would accumulate. FSDP2 and DDP run a collective inside every forward or backward, so
every rank must run the same number of micro-batches or the step hangs: a rank with fewer rows pads
with micro-batches whose loss is multiplied by 0 (a gradient of zeros, no metrics).

`shard(model, strategy)` wraps with PyTorch's own FSDP2 (`fully_shard`): each decoder layer (the classes
the model names in `_no_split_modules`, as Hugging Face's own sharding does) and then the root, which keeps
a tied embedding and output layer in one group. `ddp` is FSDP2 over a (world, 1) mesh: every parameter
replicated, gradients all-reduced, the same code path as `fsdp2` (as torchtitan does for data parallel).

Weights leave the ranks through `full_state_dict` (a gather every rank joins at one point; rank 0 gets
the dict) and checkpoints through `save_sharded`/`load_sharded` (PyTorch's DCP, loadable at another
world size; `GatheredModel`, `Shards`, `FullOptimizer` are the checkpoint parts). What starts and
coordinates the ranks is `hone.rl.ranks.launch` (or torchrun, or Ray: `ray_learners`) and
`hone.rl.ranks.learners`.

Departures from a one-process run, on purpose: the trainer's micro-batches forward rows whole, without
the shared-prompt forward (one or two model calls by the rows: every rank must make the same calls); with
`trainer.autocast: bfloat16` the bf16 compute is FSDP2's mixed precision (every parameter cast, norms
too), not autocast's per-op choice.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Ranks:
    """This process's place among the learner ranks: `rank` of `world`."""

    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls) -> Ranks:
        """As torchrun sets them: `RANK`, `WORLD_SIZE`; one rank without them."""
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))

    def share(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's part of `rows` (a mini-batch's row indices): contiguous, sizes differing by at most
        one, in the one global order every rank drew."""
        return rows.tensor_split(self.world)[self.rank]

    def micro_batches(self, rows: torch.Tensor, size: int) -> list[tuple[torch.Tensor, bool]]:
        """This rank's micro-batches of mini-batch `rows` (at most `size` rows each), each with whether it
        is padding: a rank with fewer than the most micro-batches any rank has (rank 0's share is the
        largest) repeats one real row that many times, for its collectives only (`weigh` zeroes its loss)."""
        mine = list(self.share(rows).split(size))
        most = math.ceil(math.ceil(len(rows) / self.world) / size)
        return [(m, False) for m in mine] + [(rows[:1], True)] * (most - len(mine))

    def weigh(self, loss: torch.Tensor, padding: bool) -> torch.Tensor:
        """A micro-batch's loss as this rank backwards it: 0 x a padding one's; a real one x the world size
        (PyTorch averages gradients over ranks: the average of these is the sum one process would have)."""
        if padding:
            return loss * 0.0
        return loss * float(self.world) if self.world > 1 else loss

    def by_rows(self, rows: int, score: Callable[[torch.Tensor | None], torch.Tensor]) -> torch.Tensor:
        """`score(row indices)` of a batch of `rows` rows (`[len(indices), ...]`, no grad), each rank
        scoring its contiguous share and the parts all-gathered in order; `score(None)` (the whole batch)
        on one rank. A share is padded to the largest by repeating a row, so every rank makes the same
        model calls (FSDP gathers inside each), and the padding is dropped after the gather."""
        if self.world == 1:
            return score(None)
        shares = torch.arange(rows).tensor_split(self.world)
        most = len(shares[0])
        mine = shares[self.rank]
        filler = mine[:1] if len(mine) else torch.zeros(1, dtype=torch.long)
        out = score(torch.cat([mine, filler.repeat(most - len(mine))]))
        parts = [torch.empty_like(out) for _ in range(self.world)]
        dist.all_gather(parts, out.contiguous())
        return torch.cat([part[: len(share)] for part, share in zip(parts, shares, strict=True)])

    def same(self, value: float) -> float:
        """Rank 0's `value` on every rank (e.g. an LR that follows rank 0's clock under a time limit)."""
        if self.world == 1:
            return value
        box: list[Any] = [value]
        dist.broadcast_object_list(box, src=0)
        return float(box[0])

    def gather_stats(self, stats: list[Any]) -> list[Any]:
        """Every rank's per-micro-batch stats (dicts of tensors), rank 0's first; unchanged on one rank."""
        if self.world == 1:
            return stats
        mine = [{k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in s.items()} for s in stats]
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, mine)
        return [s for part in gathered for s in part]

    def barrier(self) -> None:
        """Wait for every rank (bounded by the process group's timeout); nothing on one rank."""
        if self.world > 1:
            dist.barrier()

    def max_metric(self, value: float) -> float:
        """The largest of every rank's `value`; unchanged on one rank."""
        if self.world == 1:
            return value
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, value)
        return float(max(gathered))

    def sum_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """`sums` summed over the ranks (keys a rank lacks count as 0); unchanged on one rank."""
        if self.world == 1:
            return sums
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, dict(sums))
        total: dict[str, float] = {}
        for part in gathered:
            for key, value in part.items():
                total[key] = total.get(key, 0.0) + value
        return total


ONE_RANK = Ranks()  # one process: the default wherever ranks are optional


def init_ranks(ranks: Ranks, *, timeout_s: float, init_method: str | None = None) -> None:
    """Join the process group of `ranks` (gloo for CPU tensors, NCCL for CUDA ones), every collective
    bounded by `timeout_s`: a rank that dies or hangs ends the others' waits with an error, not a hang."""
    if ranks.world == 1 or dist.is_initialized():
        return
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo",
        init_method=init_method,
        rank=ranks.rank,
        world_size=ranks.world,
        timeout=timedelta(seconds=timeout_s),
    )


STRATEGIES = ("fsdp2", "ddp")


def copy_from_rank0(model: nn.Module, ranks: Ranks) -> None:
    """Make every rank's (unsharded) `model` rank 0's, tensor by tensor: a warm start trained on rank 0
    alone, or a model whose initialisation drew from a seeded but per-process RNG. Before `shard`: FSDP2
    takes each rank's slice of the weights it holds."""
    if ranks.world == 1:
        return
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def shard(model: nn.Module, strategy: str, ranks: Ranks, *, bf16: bool = False) -> nn.Module:
    """Wrap `model` in place for `strategy` over the default process group (see the module docstring);
    build its optimizer after this. One rank: the model as it is. `bf16` (`trainer.autocast: bfloat16`):
    FSDP2's mixed precision, parameters gathered and computed in bf16, gradients reduced in fp32 into the
    fp32 shards the optimizer steps (torchtitan's default; keep `model.dtype` float32 for fp32 masters)."""
    if ranks.world == 1:
        return model
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    precision = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if bf16 else MixedPrecisionPolicy()

    device = next(model.parameters()).device.type
    device = "cpu" if device == "meta" else device  # a model built on the meta device (sizes only)
    if strategy == "ddp":
        mesh = init_device_mesh(device, (ranks.world, 1), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device, (ranks.world,))
    # The layer classes every Hugging Face model inside names (a critic's trunk sits under its value head).
    layer_classes = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or ())}
    for module in model.modules():
        if module is not model and type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh, mp_policy=precision)
    fully_shard(model, mesh=mesh, mp_policy=precision)
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether `shard` has wrapped `model` already (an SFT warm start on N ranks shards it first)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: nn.Module, ranks: Ranks) -> dict[str, torch.Tensor]:
    """The whole model's state dict, on CPU, on rank 0 ({} on the others). A collective on N ranks: every
    rank calls it at the same point (before publishing weights or saving the Hugging Face model), never
    lazily inside one rank's publish (TRL #7103: ranks gathering at different points deadlocked)."""
    if ranks.world == 1:
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    if ranks.rank == 0:  # a tied parameter (embedding and LM head) as one tensor, as one process has it,
        seen: dict[int, str] = {}  # so `save_pretrained` writes it once
        for name, tensor in model.state_dict(keep_vars=True).items():
            first = seen.setdefault(id(tensor), name)
            if first != name and first in state and name in state:
                state[name] = state[first]
    return state


def load_full_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a one-process `optimizer.state_dict()` (its parameters numbered in the order `model`'s
    trainable parameters are named) into the optimizer of sharded `model`: each rank keeps its slice of
    every moment."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [name for name, p in model.named_parameters() if p.requires_grad]
    by_name: dict[str, Any] = {
        "state": {names[int(i)]: v for i, v in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[int(i)] for i in group["params"]]} for group in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def save_sharded(directory: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Each rank writes its shards of the model and optimizer state (PyTorch's distributed checkpoint,
    DCP) into `directory`; a collective. Loadable at another world size (`load_sharded`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)


def load_sharded(directory: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load `save_sharded`'s `directory` into `model` and `optimizer` as they are sharded now (any world
    size, one process included): DCP reshards on load."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.load(
        {"model": model_state, "optim": optim_state},
        checkpoint_id=directory,
        no_dist=not dist.is_initialized(),
    )
    set_state_dict(
        model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state
    )  # filled in place


class GatheredModel:
    """A sharded model as a checkpoint's `name/` part: every rank joins the gather, rank 0 writes its
    owner's `save_pretrained` directory from the whole state, so `from_pretrained`, `hone eval` and a
    sampler load it as one process's. `load_weights` reads it into the owner unsharded (before `shard`)."""

    def __init__(self, owner: Any, module: nn.Module, ranks: Ranks) -> None:
        self.owner, self.module, self.ranks = owner, module, ranks

    def save_pretrained(self, directory: Path) -> None:
        state = full_state_dict(self.module, self.ranks)
        if self.ranks.rank == 0:
            self.owner.save_pretrained(directory, state_dict=state)

    def load_weights(self, directory: Path) -> None:
        self.owner.load_weights(directory)


class Shards:
    """A model and its optimizer as a checkpoint's DCP part (`save_sharded`/`load_sharded`): each rank
    writes its shards, and any world size reads them back, one process included."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.module, self.optimizer = module, optimizer

    def save_pretrained(self, directory: Path) -> None:
        save_sharded(str(directory), self.module, self.optimizer)

    def load_weights(self, directory: Path) -> None:
        load_sharded(str(directory), self.module, self.optimizer)


class FullOptimizer:
    """A one-process checkpoint's `optimizer.pt` read into the optimizer of a sharded model (a run that
    one process wrote, resumed on N ranks)."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.module, self.optimizer = module, optimizer

    def state_dict(self) -> dict[str, Any]:
        raise TypeError("FullOptimizer only loads; N ranks save their optimizer as DCP shards")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_full_optimizer(self.module, self.optimizer, state)

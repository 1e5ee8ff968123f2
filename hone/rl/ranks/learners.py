"""N learner ranks in one run: rank 0 runs the loop, the others follow its learner, call for call.

Rank 0 is the controller (the approach of prime-rl and the research in
`../shared/research/distributed-learner.md`): it alone samples, scores, evaluates and logs. The other
ranks hold only the learner's models (each its shard) and wait for rank 0's next command, sent over a
gloo group of its own (`Commands`):

    start   build the reference, trainer and critic from rank 0's weights (and load the checkpoint)
    learn   `Learner.learn` on the step's rollouts: the same log-prob passes, update and publish gather
    gather  join a gather of the weights rank 0 publishes outside a learn (a resume's first publish)
    save    the checkpoint's collective parts (the gathered `model/`, the DCP shards)
    stop    the run is over

So every collective happens on every rank at the same point, in the same order, by construction: the
followers run the same functions on the same inputs. A command's wait has no useful bound (rank 0 may
sample or evaluate for an hour between two `learn`s), so it gets a week; a rank that dies is seen by the
launcher (`hone.rl.ranks.launch`) or torchrun, which ends the run, and every collective *inside* a
command is bounded by `trainer.collective_timeout_s`.

Weights reach the samplers from rank 0 only: every rank joins the gather (`GatheredWeights.gather`, a
full state dict on rank 0), then rank 0 publishes through the run's weight channel as one process does.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hone.config import HoneConfig
from hone.models import resolve_model
from hone.rl.canary import build_canary
from hone.rl.components import RunComponents, weight_channel
from hone.rl.learner import Learner
from hone.rl.placement.weights import WeightChannel
from hone.rl.producer import ScoredGroups
from hone.rl.start import (
    LearnerStart,
    learner_models,
    loaded_models,
    saved_models,
    shard_policy,
)
from hone.rl.warmstart import SFTData, SFTSettings, train_sft
from hone.rollout.fingerprint import WeightMismatchError, add_sums, bit_sum
from hone.run.lifecycle import start_process
from hone.training.checkpoint import RNG, RNG_FILE, Checkpointer
from hone.training.distributed import Ranks, full_state_dict, init_ranks
from hone.training.models import load_policy
from hone.training.policy import Policy

log = logging.getLogger("hone")

COMMAND_WAIT = timedelta(days=7)


class Commands:
    """Rank 0's commands to the other learner ranks, broadcast over a gloo group of their own (so a
    follower's wait for the next one is not bound by the collectives' timeout)."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.group = dist.new_group(backend="gloo", timeout=COMMAND_WAIT)

    def send(self, kind: str, **payload: Any) -> None:
        dist.broadcast_object_list([(kind, payload)], src=0, group=self.group)

    def receive(self) -> tuple[str, dict[str, Any]]:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        kind, payload = box[0]
        return kind, payload


class GatheredWeights:
    """Rank 0's weight source on N ranks: the tensors the engine's own source names (`names`, read from
    the policy at set-up), taken from the state every rank gathered at the publish: as they are, or
    merged (`Policy.state_dict_for_sampler`: an engine that loads a LoRA policy's merged weights)."""

    def __init__(self, names: list[str], policy: Policy, ranks: Ranks) -> None:
        self.names, self.policy, self.ranks = names, policy, ranks
        self._state: dict[str, torch.Tensor] | None = None

    def gather(self) -> None:
        """Every rank, at the same point: rank 0 then holds the whole state, checked against the ranks'
        shards (`verify_gather`) before anything is published from it."""
        self._state = full_state_dict(self.policy.model, self.ranks)
        verify_gather(self.policy.model, self._state, self.ranks)

    def release(self) -> None:
        self._state = None

    @property
    def state(self) -> dict[str, torch.Tensor] | None:
        """The gathered state (rank 0; {} elsewhere), between `gather` and `release`."""
        return self._state

    @contextlib.contextmanager
    def held(self) -> Iterator[dict[str, torch.Tensor]]:
        """Every rank gathers here; inside, the whole state (on rank 0), released after."""
        assert self._state is None, "a gather inside a gather"
        self.gather()
        try:
            yield self._state or {}
        finally:
            self.release()

    def join(self) -> None:
        """A rank other than 0: its part of a gather rank 0 makes now."""
        with self.held():
            pass

    def __call__(self) -> dict[str, torch.Tensor]:
        if self._state is None:
            raise RuntimeError("the learner ranks' weights are read between gather() and release() only")
        state = self._state
        if not set(self.names) <= state.keys():
            state = self.policy.state_dict_for_sampler(state)
        return {name: state[name] for name in self.names}


def verify_gather(model: torch.nn.Module, state: dict[str, torch.Tensor], ranks: Ranks) -> None:
    """Rank 0's gathered `state` against what the ranks hold (a collective: every rank calls it): a
    parameter each rank holds whole (DDP's replicas) must have the gathered tensor's exact fingerprint on
    every rank, and a sharded one (FSDP2) the sum of its shards' fingerprints (`rollout.fingerprint`: bit
    sums add over a split). `WeightMismatchError` on rank 0 names the parameter and the ranks."""
    local = {}
    for name, param in model.named_parameters():
        shard = param.to_local() if hasattr(param, "to_local") else param
        local[name] = (bit_sum(shard), shard.numel() == param.numel())
    reports = ranks.gather_stats([local])
    if ranks.rank != 0:
        return
    for name, tensor in state.items():
        held = [report[name] for report in reports if name in report]
        if not held:
            continue  # a buffer, or the second name of a tied parameter
        gathered = bit_sum(tensor)
        if all(whole for _, whole in held):
            wrong = [k for k, (value, _) in enumerate(held) if value != gathered]
        else:
            wrong = [] if add_sums([value for value, _ in held]) == gathered else list(range(len(held)))
        if wrong:
            raise WeightMismatchError(
                f"the gathered {name} differs from what learner rank(s) {wrong} hold: the weights published "
                "would not be the ones trained"
            )


class LeadRanks:
    """Rank 0's side: it sends each command before doing its own part of it."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.commands = Commands(ranks)
        self.gathered: GatheredWeights | None = None
        self.cfg: HoneConfig | None = None  # the run's, for an SFT warm start (`attach`)
        self.parts: RunComponents | None = None

    def attach(self, cfg: HoneConfig, parts: RunComponents) -> None:
        self.cfg, self.parts = cfg, parts

    def begin_sft(self, texts: list[tuple[str, str]], data: SFTData, settings: SFTSettings) -> WeightChannel:
        """An SFT warm start on every rank: the others are told (with the examples) and shard their policy
        as this one does; rank 0's weight channel then publishes gathered weights."""
        assert self.parts is not None and self.cfg is not None
        self.commands.send("sft", texts=texts, data=SFTData(examples=data.examples), settings=settings)
        shard_policy(self.cfg, self.parts.policy, self.ranks)
        return self.gather_weights(self.cfg, self.parts).weights

    def gathered_state(self) -> contextlib.AbstractContextManager[dict[str, torch.Tensor]]:
        """Every rank gathers at this point of the SFT the others run too; the whole state, on rank 0."""
        assert self.gathered is not None
        return self.gathered.held()

    def share_score(self, score: float) -> float:
        self.commands.send("score", score=score)
        return score

    def announce(self, start: LearnerStart) -> None:
        self.commands.send("start", start=start)

    def gather_weights(self, cfg: HoneConfig, parts: RunComponents) -> RunComponents:
        """After sharding: `parts` with a weight channel that reads the gathered state (the engine's names
        are read from the source it had, whose tensors are the sharded model's now: only their names are
        used). Once: later calls (an SFT warm start on the ranks gathered first) return the same parts."""
        if self.gathered is None:
            names = list(parts.weight_source())
            self.gathered = GatheredWeights(names, parts.policy, self.ranks)
            weights = weight_channel(cfg, self.gathered, parts.sampler)
            self.parts = replace(parts, weight_source=self.gathered, weights=weights)
        assert self.parts is not None
        return self.parts

    def publisher(self, publish: Any) -> Any:
        """`publish(version)` on rank 0 between every rank's gather and the release of the state."""
        gathered = self.gathered
        assert gathered is not None

        def ranked_publish(version: int) -> None:
            with gathered.held():
                publish(version)

        return ranked_publish

    @contextlib.contextmanager
    def weights_held(self) -> Iterator[None]:
        """Every rank gathers now (`gather`); inside, rank 0's weight source reads the whole state (a publish
        outside a learn: a resume's, a Ray executor's first one to its new actors)."""
        assert self.gathered is not None
        self.commands.send("gather")
        with self.gathered.held():
            yield

    def learn(self, groups: ScoredGroups, step: int, version: int) -> None:
        """Every other rank learns from `groups` as rank 0 does, at rank 0's weight `version` (which rows
        the log-prob canary compares)."""
        self.commands.send("learn", rollouts=groups.rollouts, step=step, version=version)

    def save(self, step: int) -> None:
        self.commands.send("save", step=step)

    def stop(self) -> None:
        self.commands.send("stop")


def start_ranks(cfg: HoneConfig, ranks: Ranks, init_method: str = "env://") -> None:
    """Join the learner ranks' process group (its address from the environment, as torchrun and
    `hone.rl.ranks.launch` set it, or `init_method`); every collective bounded by
    `trainer.collective_timeout_s`."""
    if torch.cuda.is_available() and cfg.model.device in ("auto", "cuda"):  # one GPU a rank: its local one
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", ranks.rank)))
    init_ranks(ranks, timeout_s=cfg.trainer.collective_timeout_s, init_method=init_method)


@contextlib.contextmanager
def joined_ranks(cfg: HoneConfig, world: int) -> Iterator[Ranks]:
    """This process's place among `world` learner ranks (from the environment), in their process group
    until the block ends; one rank: `Ranks()` and nothing joined."""
    if world == 1:
        yield Ranks()
        return
    ranks = Ranks.from_env()
    if ranks.rank > 0:  # rank 0 speaks for the run
        logging.getLogger("hone").setLevel(logging.WARNING)
    start_ranks(cfg, ranks)
    try:
        yield ranks
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def follow(cfg: HoneConfig, ranks: Ranks) -> None:
    """A learner rank other than 0: build the policy, then do what rank 0 says until it says stop."""
    start_process(cfg.run)
    commands = Commands(ranks)
    policy = load_policy(cfg.model, resolve_model(cfg.model.path))  # rank 0's weights replace these
    kind, payload = commands.receive()
    if kind == "sft":  # a warm start: train with rank 0, then wait for RL's start
        follow_sft(cfg, policy, ranks, commands, payload)
        kind, payload = commands.receive()
    if kind == "stop":  # rank 0 ended before RL (e.g. `hone sft`)
        return
    start: LearnerStart = payload["start"]
    models = learner_models(cfg, policy, start, ranks)
    checkpointer = Checkpointer(Path(cfg.run.dir) / cfg.run.name, keep_last=cfg.run.keep_last, ranks=ranks)
    gathered = GatheredWeights([], policy, ranks)
    if start.resume is not None:
        path = Path(start.resume)
        checkpointer.load(path, loaded_models(path, policy, models, ranks) | {RNG_FILE: RNG})
    learner = Learner(
        policy=policy,
        ref_policy=models.ref_policy,
        teacher=models.teacher,
        distill=cfg.distill,
        trainer=models.trainer,
        algorithm=cfg.algorithm,
        trainer_cfg=cfg.trainer,
        temperature=cfg.rollout.temperature,
        pad_id=start.pad_id,
        publish=lambda _version: gathered.join(),  # rank 0 publishes what the gather gives it
        critic=models.critic,
        ranks=ranks,
        canary=build_canary(cfg, f"{cfg.rollout.engine} sampler"),  # raises on every rank at once
    )
    while True:
        kind, payload = commands.receive()
        if kind == "learn":
            step = int(payload["step"])
            learner.version = int(payload["version"])
            learner.learn(
                ScoredGroups(step=step, rollouts=payload["rollouts"], metrics={}, new_tokens=0), step
            )
        elif kind == "gather":  # rank 0 publishes outside a learn
            gathered.join()
        elif kind == "save":
            checkpointer.save(int(payload["step"]), saved_models(policy, models, ranks))
        elif kind == "stop":
            return
        else:
            raise RuntimeError(f"learner rank {ranks.rank}: unknown command {kind!r} from rank 0")


def follow_sft(
    cfg: HoneConfig, policy: Policy, ranks: Ranks, commands: Commands, payload: dict[str, Any]
) -> None:
    """This rank's part of an SFT warm start: the same `train_sft` as rank 0, joining its gathers (each
    validation's publish, the final publish and save) and taking its validation scores."""
    shard_policy(cfg, policy, ranks)
    gathered = GatheredWeights([], policy, ranks)

    def score() -> float:
        gathered.join()
        kind, sent = commands.receive()
        if kind != "score":
            raise RuntimeError(f"learner rank {ranks.rank}: expected rank 0's SFT score, got {kind!r}")
        return float(sent["score"])

    train_sft(payload["settings"], policy, payload["texts"], payload["data"], score, ranks=ranks)
    gathered.join()  # rank 0 publishes and saves the result

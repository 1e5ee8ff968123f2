"""RLEP's experience replay (Zhang et al. 2025, "RLEP: Reinforcement Learning with Experience Replay"):
keep a past success of each prompt the policy has not solved well enough, and put it
back into that prompt's later groups, so a hard prompt's rare correct path is not lost to the next
unlucky sample of n.

The buffer is the producer's state, so it must resume like the rest of the run: `state_dict(step)` is
the buffer as it was before step `step` was produced (the producer may already be ahead in async mode),
and `begin(step)` restarts a step from that state (a retried step replays alike).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from hone.config import ReplayConfig
from hone.errors import HoneError
from hone.types import Rollout

REPLAY = "replay"  # `Rollout.metrics` key marking a replayed rollout


class ReplayImagesError(HoneError, ValueError):
    """`algorithm.replay` with a vision-language model: the buffer's checkpoint state is JSON, which a
    stored rollout's images would not survive (a resumed run would replay other data)."""


def is_replayed(rollout: Rollout) -> bool:
    return bool(rollout.metrics.get(REPLAY))


class ReplayBuffer:
    """One stored success per prompt id, for prompts whose latest group passed below `max_pass_rate`."""

    def __init__(self, cfg: ReplayConfig) -> None:
        self.cfg = cfg
        self._entries: dict[str, Rollout] = {}
        self._before: dict[int, dict[str, Rollout]] = {}  # step → the entries before it was produced
        self._lock = threading.Lock()  # the producer thread writes, the loop's checkpoint reads

    def begin(self, step: int) -> None:
        """Start producing `step`: from the state it first started from, if it did (a retry)."""
        with self._lock:
            if step in self._before:
                self._entries = dict(self._before[step])
            else:
                self._before[step] = dict(self._entries)

    def mix(self, rollouts: list[Rollout]) -> None:
        """In place: in each group (adjacent, one prompt) passing below `max_pass_rate` whose prompt has a
        stored success, the last rollout gives way to that success (sampling is exchangeable, so the last
        is as good as a random one), marked replayed and given the group's id; it keeps its reward, its
        sampler log-probs (the behaviour policy's) and its `policy_version`. Then the buffer learns from
        the fresh samples: a group at or above the bar drops its prompt's entry, one below it with a
        success stores its first."""
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(rollouts):
            groups.setdefault(r.group_id, []).append(i)
        with self._lock:
            learned: dict[str, Rollout | None] = {}
            for members in groups.values():
                fresh = [rollouts[i] for i in members]
                successes = [r for r in fresh if r.reward >= self.cfg.min_reward]
                solved = len(successes) / len(fresh) >= self.cfg.max_pass_rate
                stored = self._entries.get(fresh[0].sample_id)
                if stored is not None and not solved and len(members) > 1:
                    last = members[-1]
                    rollouts[last] = dataclasses.replace(
                        stored, group_id=rollouts[last].group_id, metrics={**stored.metrics, REPLAY: 1.0}
                    )
                if solved:
                    learned[fresh[0].sample_id] = None
                elif successes:
                    learned[fresh[0].sample_id] = dataclasses.replace(
                        successes[0]
                    )  # a copy: refill renumbers
            for sample_id, success in learned.items():
                if success is None:
                    self._entries.pop(sample_id, None)
                else:
                    self._entries[sample_id] = success

    def state_dict(self, step: int) -> list[dict[str, Any]]:
        """The entries before step `step` was produced (JSON-ready); forgets the states of earlier steps."""
        with self._lock:
            entries = self._before.get(step, self._entries)
            self._before = {s: e for s, e in self._before.items() if s >= step}
            return [dataclasses.asdict(r) for r in entries.values()]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        with self._lock:
            rollouts = [Rollout(**{**r, "turns": [tuple(t) for t in r["turns"]]}) for r in state]
            self._entries = {r.sample_id: r for r in rollouts}
            self._before = {}

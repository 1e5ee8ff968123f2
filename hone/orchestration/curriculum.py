"""The curriculum in the loop: each step's outcomes reach it as the loop takes the step's groups."""

from __future__ import annotations

from hone.data.curriculum import Curriculum
from hone.orchestration.producer import PromptBatch, ScoredGroups
from hone.orchestration.rollouts import RolloutSource


class CurriculumRollouts:
    """A `RolloutSource` that hands each step's per-prompt outcomes to `curriculum` as it is taken, in the
    loop's thread and in step order, and adds the `prompts/*` metrics to the step's."""

    def __init__(self, source: RolloutSource, curriculum: Curriculum) -> None:
        self.source, self.curriculum = source, curriculum

    def submit(self, prompts: PromptBatch) -> None:
        self.source.submit(prompts)

    def take(self) -> ScoredGroups:
        groups = self.source.take()
        groups.metrics |= self.curriculum.observe(groups.step, groups.outcomes)
        return groups

    def publish(self, version: int) -> None:
        self.source.publish(version)

    def close(self) -> None:
        self.source.close()

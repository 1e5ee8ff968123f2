"""A single-turn verifiers 0.4 environment for tests/test_verifiers_env.py: "What is i+1?" with a rubric of
two weighted rewards. Loaded by the adapter as `verifiers:tests.vf_envs_for_tests`."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply) <= 2 else 0.0


class SumConfig(vf.TasksetConfig):
    n: int = 40
    # The prompt as verifiers' own multi-turn examples write it (color_codeword): a list of messages,
    # each with its default `role`; `image` adds an image part to it, `image_url` its URL.
    messages: bool = False
    image: bool = False
    image_url: str = "data:,"


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> Iterator[SumTask]:
        for i in range(self.config.n):
            question = f"What is {i}+1?"
            prompt: str | list[vf.UserMessage] = question
            if self.config.messages or self.config.image:
                content: vf.types.MessageContent = question
                if self.config.image:
                    content = [
                        vf.types.TextContentPart(text=question),
                        vf.types.ImageUrlContentPart(
                            image_url=vf.types.ImageUrlSource(url=self.config.image_url)
                        ),
                    ]
                prompt = [vf.UserMessage(content=content)]
            data = SumData(prompt=prompt, system_prompt="Answer with a number.", answer=str(i + 1))
            yield SumTask(data, self.config.task)


__all__ = ["SumTaskset"]

"""reasoning-gym's procedural tasks as a `Task`: `data.source: reasoning_gym:<name>` (the `gym` extra).

Why a `Task` and not rows: a reasoning-gym dataset is a generator with a verifier (`score_answer`), which
is what `Task` already is, so `reward.fn: task`, the held-out eval and SFT demonstrations work unchanged.
`data.args` is the dataset's config (difficulty settings); its `size` and `seed` come from
`data.train_size`/`data.eval_size` and `run.seed`, so they are refused there. Train and eval problems come
from different derived seeds; as the problem spaces of easy settings are small, a question drawn for one
split that the other already holds is dropped (and replaced): eval drops are warned about, and an eval
split left short is an error (with `at_most`, what was found).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import logging
import re
from typing import Any

from hone.data.errors import HoneDataError
from hone.data.tasks import Task, first_line
from hone.types import Sample

log = logging.getLogger("hone")

PREFIX = "reasoning_gym:"
_RESERVED = ("size", "seed")  # set from data.train_size/eval_size and run.seed
_CANDIDATES_PER_SAMPLE = 4  # pool drawn per wanted problem: room to replace the other split's questions
_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def extract_answer(response_text: str) -> str:
    """What a response is graded on: the last `<answer>…</answer>` if it has one (reasoning-gym's own
    convention, for chat models), else its first line (the bare answer a small model is taught)."""
    tagged = _ANSWER_TAG.findall(response_text)
    return tagged[-1].strip() if tagged else first_line(response_text)


class ReasoningGymTask(Task):
    """One reasoning-gym dataset, or `composite` with `data.args: {datasets: {name: {weight, config}}}`."""

    def __init__(self, dataset: str, args: dict[str, Any]) -> None:
        try:
            import reasoning_gym  # deferred: importing it costs a second
        except ImportError:
            raise HoneDataError(
                f"data.source {PREFIX}{dataset} needs reasoning-gym: pip install -e '.[gym]' in a Hone clone"
            ) from None
        self._registry = reasoning_gym.factory.DATASETS
        self.name = f"{PREFIX}{dataset}"  # type: ignore[misc]  # per instance: one class, many datasets
        self.dataset = dataset
        self.config = self._check(dataset, args, "data.args")
        if dataset == "composite":
            self._specs = self._composite_specs(args)
        self._datasets: dict[int, Any] = {}  # by seed, for scoring a sample against its own config
        self._questions: dict[str, set[str]] = {"train": set(), "eval": set()}
        self._make_dataset(seed=0, size=1)  # settings the config's own validate() refuses fail now

    def _check(self, name: str, args: Any, where: str) -> dict[str, Any]:
        if name not in self._registry:
            close = difflib.get_close_matches(name, self._registry, n=3) or sorted(self._registry)[:5]
            raise HoneDataError(
                f"unknown reasoning-gym task {name!r}; e.g. {', '.join(close)} "
                f"({len(self._registry)} in reasoning_gym.factory.DATASETS)"
            )
        if not isinstance(args, dict):
            raise HoneDataError(f"{where} must be a mapping, got {type(args).__name__}")
        settings = {f.name for f in dataclasses.fields(self._registry[name][1])}
        for key in args:
            if key in _RESERVED:
                raise HoneDataError(
                    f"{where}.{key}: set by data.train_size/data.eval_size and run.seed, not here"
                )
            if key not in settings:
                raise HoneDataError(
                    f"{where}.{key}: not a setting of reasoning-gym task {name!r} "
                    f"(settings: {', '.join(sorted(settings - set(_RESERVED)))})"
                )
        return dict(args)

    def _composite_specs(self, args: dict[str, Any]) -> list[Any]:
        from reasoning_gym.composite import DatasetSpec

        datasets = args.get("datasets")
        if not isinstance(datasets, dict) or not datasets:
            raise HoneDataError(
                "data.args.datasets: reasoning_gym:composite needs {name: {weight: w, config: {...}}}"
            )
        specs = []
        for name, spec in datasets.items():
            where = f"data.args.datasets.{name}"
            spec = {"weight": 1.0} if spec is None else spec
            if not isinstance(spec, dict) or set(spec) - {"weight", "config"}:
                raise HoneDataError(f"{where}: expected {{weight: w, config: {{...}}}}, got {spec!r}")
            weight = spec.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                raise HoneDataError(f"{where}.weight must be a positive number, got {weight!r}")
            config = self._check(name, spec.get("config") or {}, f"{where}.config")
            specs.append(DatasetSpec(name=name, weight=float(weight), config=config))
        return specs

    def _make_dataset(self, seed: int, size: int) -> Any:
        from reasoning_gym import create_dataset

        config = {**self.config, "datasets": self._specs} if self.dataset == "composite" else self.config
        try:
            made = create_dataset(self.dataset, seed=seed, size=size, **config)
        except (AssertionError, ValueError, TypeError) as e:  # the configs' validate() asserts
            raise HoneDataError(f"data.args for reasoning-gym task {self.dataset!r}: {e}") from None
        self._datasets[seed] = made
        return made

    def _draw(self, n: int, seed: int, eval_split: bool, at_most: bool = False) -> list[Sample]:
        split = "eval" if eval_split else "train"
        gym_seed = _derived_seed(split, seed)
        pool = self._make_dataset(gym_seed, n * _CANDIDATES_PER_SAMPLE + 16)
        other = self._questions["train" if eval_split else "eval"]
        samples: list[Sample] = []
        taken: set[str] = set()
        dropped = 0
        for index in range(len(pool)):
            if len(samples) == n:
                break
            entry = pool[index]
            question = entry["question"]
            if question in other:
                dropped += 1
                continue
            if eval_split and question in taken:  # eval problems are distinct; training may repeat
                continue
            taken.add(question)
            samples.append(
                Sample(
                    id=f"{self.name}-{split}-{seed}-{len(samples)}",
                    prompt=question,
                    answer=str(entry["answer"]),
                    meta={"gym_seed": gym_seed, "metadata": entry["metadata"]},
                )
            )
        if dropped and eval_split:
            log.warning("%s: dropped %d eval problems that are training problems", self.name, dropped)
        if len(samples) < n and not at_most:
            raise HoneDataError(
                f"{self.name}: found only {len(samples)} {split} problems of {n} that are not "
                f"{'training problems (and distinct)' if eval_split else 'eval problems'}; "
                "widen data.args or lower data.eval_size/data.train_size"
            )
        self._questions[split].update(s.prompt or "" for s in samples)
        return samples

    def reward(self, response_text: str, sample: Sample) -> float:
        """reasoning-gym's `score_answer` on the extracted answer (some tasks give partial credit)."""
        entry = {"question": sample.prompt, "answer": sample.answer, "metadata": sample.meta["metadata"]}
        seed = sample.meta["gym_seed"]
        if (
            seed not in self._datasets
        ):  # a sample from another instance: scoring needs the config, not the size
            self._make_dataset(seed, size=1)
        return float(self._datasets[seed].score_answer(extract_answer(response_text), entry))

    def demonstration(self, sample: Sample) -> str:
        return sample.answer or ""


def _derived_seed(split: str, seed: int) -> int:
    """Distinct reasoning-gym seeds per split, so run.seed 0 trains on other problems than EVAL_SEED 0."""
    return int.from_bytes(hashlib.sha256(f"{split}/{seed}".encode()).digest()[:4], "big")

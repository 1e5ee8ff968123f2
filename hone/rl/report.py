"""What a run tells about itself: how many steps updated the policy and how many had no signal (the end
summary, the progress line, the warning when nothing was learned), and the samples it logs.

A step *had no signal* when it scored some responses but no group among those it trained on had rewards
that differ (`groups/with_signal` 0): every advantage of a group-relative estimator is then 0 (unless the
step distilled from a teacher, `distill/reverse_kl`: its per-token advantages need no reward). A step
*updated the policy* when the learner published new weights (`train/policy_updated`: its groups were not
all filtered out, and it was not a critic warm-up step) and it had a signal. Both are logged per step in
metrics.jsonl, so a resumed run counts the steps before it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hone.rewards import reward_failed
from hone.rl.producer import ScoredGroups, grouped
from hone.types import Rollout, Sample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from hone.rl.loop import RunResult

UPDATED = "train/policy_updated"  # 1 when the step published new policy weights
DISTILLED = "distill/reverse_kl"  # logged when a teacher scored the step's tokens: a signal without rewards
WITH_SIGNAL = "groups/with_signal"  # the step's trained groups whose rewards differ


def step_signal(groups: ScoredGroups, updated: bool) -> dict[str, float]:
    """The step's `train/policy_updated` and `groups/with_signal` metrics."""
    differing = sum(len({r.reward for r in group}) > 1 for group in grouped(groups.rollouts))
    return {UPDATED: float(updated), WITH_SIGNAL: float(differing)}


@dataclass
class StepTally:
    """RL steps done, those that updated the policy, and those with only equal-reward groups."""

    steps: int = 0
    updated: int = 0
    no_signal: int = 0

    def add(self, metrics: Mapping[str, object]) -> None:
        self.steps += 1
        scored = metrics.get("reward/excluded_frac", 0.0) != 1.0  # else a reward outage: no grades at all
        no_signal = WITH_SIGNAL in metrics and not metrics[WITH_SIGNAL] and DISTILLED not in metrics
        # An update on equal-reward groups only (skip_zero_variance_groups off) has every advantage 0: it
        # does not count as updating the policy.
        self.updated += bool(metrics.get(UPDATED)) and not no_signal
        self.no_signal += no_signal and scored

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, object]], up_to: int) -> StepTally:
        """The tally of a metrics.jsonl's RL-step rows up to step `up_to` (a resumed run's start)."""
        tally = cls()
        for row in rows:
            step = row.get("step")
            if isinstance(step, int) and 0 < step <= up_to and UPDATED in row:
                tally.add(row)
        return tally

    def line(self) -> str:
        """'N of M steps updated the policy; K steps had only equal-reward groups (no signal)'."""
        return (
            f"{self.updated} of {self.steps} steps updated the policy; {self.no_signal} "
            f"step{'' if self.no_signal == 1 else 's'} had only equal-reward groups (no signal)"
        )


def nothing_learned(tally: StepTally) -> str | None:
    """A loud multi-line warning when RL steps ran but none updated the policy or none had a signal."""
    if tally.steps == 0 or (tally.updated and tally.no_signal < tally.steps):
        return None
    if tally.no_signal == tally.steps:
        why = [
            f"every one of the {tally.steps} RL steps had only groups whose rewards were all equal, so every",
            "advantage was 0 and there was nothing to learn from. The model is too weak (every answer",
            "wrong) or too strong (every answer right) for this task, or the reward is constant.",
        ]
    else:
        why = [
            f"none of the {tally.steps} RL steps updated the policy: their groups were filtered out",
            "(equal rewards, failed rewards or environments) or they were critic warm-up steps.",
        ]
    return "\n".join(
        [
            f"WARNING: this run did not train the policy ({tally.line()}).",
            *(f"  {line}" for line in why),
            "  Try: a supervised warm start on the answer format (sft.enabled=true; with your own data",
            "  also sft.data=<prompt/response jsonl>), a stronger model.path, an easier task, a larger",
            "  rollout.n; and read what the model writes: logging.samples=4 (runs/<name>/samples.jsonl).",
        ]
    )


def sample_records(
    step: int,
    sampled: Sequence[Rollout],
    trained: Sequence[Rollout],
    advantages: Sequence[float],
    tokenizer: PreTrainedTokenizerBase,
    turn_advantages: Sequence[list[float]] = (),
    samples: Mapping[str, Sample] | None = None,
) -> list[dict[str, object]]:
    """samples.jsonl's records of RL step `step` (1-based, as metrics.jsonl's): each `sampled` rollout's
    prompt as the model saw it (rendered, special tokens kept), response, reward and its parts, its
    sample's `meta` when `samples` (by id) holds it, and its advantage (the mean over its response tokens)
    when it was `trained` on, else null (filtered out).
    A multi-turn episode's record also has its conversation (`messages`, images as "[image]") and, when
    trained on, each turn's advantage (`turn_advantages`)."""
    position = {id(r): i for i, r in enumerate(trained)}
    records = []
    for r in sampled:
        i = position.get(id(r))
        episode: dict[str, object] = conversation(r)
        if r.messages is not None:
            episode["turn_advantages"] = (
                turn_advantages[i] if i is not None and i < len(turn_advantages) else None
            )
        records.append(
            {
                "step": step,
                **response_record(r, tokenizer, None if samples is None else samples.get(r.sample_id)),
                "reward_failed": reward_failed(r),
                "advantage": advantages[i] if i is not None and i < len(advantages) else None,
                "policy_version": r.policy_version,
                **episode,
            }
        )
    return records


def response_record(
    rollout: Rollout, tokenizer: PreTrainedTokenizerBase, sample: Sample | None = None
) -> dict[str, object]:
    """What every record of a sampled response starts with (samples.jsonl, `hone eval --samples`): its
    sample id, the prompt as the model saw it (rendered, special tokens kept), the response, why it ended,
    its reward and the reward's parts; with its `sample`, that sample's `meta` (a dataset row's columns
    other than prompt, answer, id and images: what a reward reads beside the response), JSON-safe."""
    record: dict[str, object] = {
        "sample_id": rollout.sample_id,
        "prompt": tokenizer.decode(rollout.token_ids[: rollout.prompt_len], skip_special_tokens=False),
        "response": rollout.response_text,
        "finish_reason": rollout.finish_reason,
        "reward": rollout.reward,
        "reward_parts": dict(rollout.reward_parts),
        **({"extra": dict(rollout.extra)} if rollout.extra else {}),  # TRL rewards' log_extra columns
    }
    if sample is not None:
        record["meta"] = json_safe(sample.meta)
    return record


def json_safe(value: object) -> object:
    """`value` as JSON can hold it: mappings (keys as strings), lists and tuples (as lists) and scalars as
    they are, anything else (an image, a date, a tensor) as its `repr`, so one odd column never costs a
    record."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return repr(value)


def conversation(rollout: Rollout) -> dict[str, object]:
    """{"messages": [...]} of a multi-turn episode, each message's content as text; {} for single-turn."""
    if rollout.messages is None:
        return {}
    return {
        "messages": [{"role": m["role"], "content": message_text(m.get("content"))} for m in rollout.messages]
    }


def message_text(content: object) -> str:
    """A message's content as text: a list of parts (images among them) joined, an image as "[image]"."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p.get("text", "") if p.get("type") == "text" else "[image]"
            for p in content
            if isinstance(p, dict)
        ]
        return "".join(parts)
    return "" if content is None else str(content)


def run_summary(result: RunResult, seconds: float) -> str:
    """The lines `hone train` ends with: where, how many steps and what they did, the held-out accuracy
    (the mean reward, for an eval without accuracy) before and after. A resumed run's first eval is the
    one logged at the step it resumed from (when that step had one), labelled so; the eval before RL
    (step 0) is shown too."""
    tally = result.tally
    lines = [
        "",
        f"run directory   {result.run_dir}",
        f"RL steps        {result.steps}   ({tally.line()})",
        f"wall time       {seconds:.0f} s",
    ]
    # Accuracy, or the mean reward where the eval has no accuracy (a dataset without an answer column).
    key, name = (
        ("eval/accuracy", "accuracy") if "eval/accuracy" in result.final_eval else ("eval/reward", "reward")
    )
    after = result.final_eval.get(key)
    labelled = [("before RL", 0, result.start_eval.get(key))]
    if result.resumed_at is not None:
        resumed = result.resumed_at
        labelled.append((f"at resume (step {resumed})", resumed, result.resume_eval.get(key)))
    evals = [(label, step, value) for label, step, value in labelled if value is not None]
    if after is not None and evals:
        width = max(len(label) for label, _, _ in [*evals, ("after RL", 0, 0.0)])
        lines += [f"held-out {name} {label:{width}s}  {_shown(key, value)}" for label, _, value in evals]
        _, since, first = evals[-1]
        change = f"{100 * (after - first):+.1f} points" if key == "eval/accuracy" else f"{after - first:+.3f}"
        lines.append(
            f"held-out {name} {'after RL':{width}s}  {_shown(key, after)}   ({change} since step {since})"
        )
    return "\n".join(lines)


def _shown(key: str, value: float) -> str:
    return f"{100 * value:5.1f}%" if key == "eval/accuracy" else f"{value:6.3f}"

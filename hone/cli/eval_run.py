"""`hone eval` of a run: its own recipe (`runs/<name>/config.yaml`) and one of its models.

`hone eval --run runs/X [--step N]` evaluates checkpoint step-N's model (default: the run's final model
when it saved one, `runs/X/model`; else its latest checkpoint; else its SFT model) with the run's config;
overrides still apply. `hone eval --model runs/X/checkpoints/step-N/model` without a recipe does the same
for that model: a model inside a run directory is evaluated with that run's recipe, not the default one.
Nothing here loads a model (light imports: a bad flag fails in a second).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hone.config import ConfigError, HoneConfig, load_config
from hone.rewards import is_correct
from hone.rl.report import conversation, response_record

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from hone.types import Rollout, Sample

log = logging.getLogger("hone")

RUN_CONFIG = "config.yaml"
POLICY_FILE = "policy.safetensors"  # a control run's saved policy (hone.control.loops.onpolicy)
_STEP_DIR = re.compile(r"^step-(\d+)$")  # as `hone.training.checkpoint` names them


def eval_config(
    recipe: str | None, overrides: list[str], *, run: str | None, step: int | None, model: str | None
) -> HoneConfig:
    """The config `hone eval` evaluates with (see the module doc); one-line `ConfigError`s for flags that
    do not go together."""
    if run is None:
        if step is not None:
            raise ConfigError("--step N goes with --run runs/<name> (a checkpoint of that run)")
        run_dir = run_dir_of(model) if recipe is None and model else None
        if run_dir is None:
            return load_config(recipe, overrides)
        log.info(
            "eval: %s is inside the run %s: using its %s (give a recipe to use another)",
            model,
            run_dir,
            RUN_CONFIG,
        )
        return load_config(run_dir / RUN_CONFIG, overrides)
    if recipe is not None:
        raise ConfigError(
            f"--run takes the run's own {RUN_CONFIG}; pass overrides only, not a recipe ({recipe})"
        )
    if model is not None:
        raise ConfigError(
            "--run evaluates a model of the run (--step N picks one); --model goes without --run"
        )
    run_dir = Path(run)
    if not (run_dir / RUN_CONFIG).is_file():
        raise ConfigError(f"--run {run}: no {RUN_CONFIG} there (is it a run directory?)")
    model_dir = run_model(run_dir, step)
    log.info("eval: %s with %s", model_dir, run_dir / RUN_CONFIG)
    return load_config(run_dir / RUN_CONFIG, [f"model.path={model_dir}", *overrides])


def run_dir_of(model: str) -> Path | None:
    """The run directory a model directory lies in (`runs/X/checkpoints/step-N/model`, `runs/X/sft`):
    the nearest of its three parents holding a config.yaml and a metrics.jsonl; None for any other."""
    path = Path(model)
    if not path.is_dir():
        return None
    for parent in list(path.parents)[:3]:
        if (parent / RUN_CONFIG).is_file() and (parent / "metrics.jsonl").is_file():
            return parent
    return None


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the run's complete checkpoints (`checkpoints/step-N` with state.json), ascending."""
    root = run_dir / "checkpoints"
    found = []
    for path in root.iterdir() if root.is_dir() else ():
        match = _STEP_DIR.match(path.name)
        if match and (path / "state.json").is_file() and (path / "model").is_dir():
            found.append(int(match.group(1)))
    return sorted(found)


def run_model(run_dir: Path, step: int | None) -> Path:
    """The model directory `--run run_dir [--step step]` evaluates."""
    steps = checkpoint_steps(run_dir)
    if step is not None:
        if step not in steps:
            have = ", ".join(f"step-{s}" for s in steps) or "none"
            raise ConfigError(f"--step {step}: {run_dir} has no checkpoint step-{step} (checkpoints: {have})")
        return run_dir / "checkpoints" / f"step-{step}" / "model"
    if (run_dir / "model" / "config.json").is_file():  # a run that saves its final model (dpo)
        return run_dir / "model"
    if (run_dir / "model" / POLICY_FILE).is_file():  # a control run's policy network
        return run_dir / "model"
    if steps:
        return run_dir / "checkpoints" / f"step-{steps[-1]}" / "model"
    if (run_dir / "sft" / "config.json").is_file():  # `hone sft`
        return run_dir / "sft"
    raise ConfigError(f"--run {run_dir}: no checkpoint and no saved model there yet")


def eval_records(
    rollouts: Sequence[Rollout], tokenizer: PreTrainedTokenizerBase, samples: Sequence[Sample] = ()
) -> list[dict[str, object]]:
    """`hone eval --samples FILE`'s records, one per response: the prompt as the model saw it, the
    response, its reward (and parts), its sample's meta (when `samples` has it), whether it is correct,
    and its failures (reward error or timeout, environment error: such a response is not graded); a
    multi-turn episode's conversation too."""
    from hone.rl.evaluate import failed  # the model-loading side: not at import

    by_id = {s.id: s for s in samples}

    return [
        {
            **response_record(r, tokenizer, by_id.get(r.sample_id)),
            "correct": None if failed(r) else is_correct(r),
            "errors": {
                "reward": bool(r.metrics.get("reward/error")),
                "reward_timeout": bool(r.metrics.get("reward/timeout")),
                "env": bool(r.metrics.get("env/errors")),
            },
            **conversation(r),
        }
        for r in rollouts
    ]

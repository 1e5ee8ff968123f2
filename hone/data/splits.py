"""A run's problem splits: what it trains on, what it evaluates on, and what SFT validates on.

The three come from one of: a built-in task (`data.task`), a reasoning-gym task (`data.source:
reasoning_gym:<name>`), a dataset file or hub name (`data.source`, evaluated on `data.eval_source` or on rows
held out of the source), or a
self-contained game (an environment that makes its own problems). `data` sits below `envs`, so a game is
passed in as a plain factory (`make_env`, its instances' class having `make_samples(n, seed, split,
**env_args)`), not imported.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hone.data.datasets import load_samples
from hone.data.errors import HoneDataError
from hone.data.gym import PREFIX as GYM_PREFIX
from hone.data.gym import ReasoningGymTask
from hone.data.images import image_key
from hone.data.tasks import Task, get_task
from hone.types import Sample

if TYPE_CHECKING:  # config imports rewards, which import data: a runtime import here would be a cycle
    from hone.config import DataConfig, HoneConfig

log = logging.getLogger("hone")

EVAL_SEED = 0  # fixed, so every run of a task is scored on the same held-out problems
# Without data.eval_source, at most this share of data.source's rows is held out for eval.
HOLD_OUT_SHARE = 0.1

# A self-contained game's environment factory: `type(make_env()).make_samples(n, seed, split, **args)`.
EnvFactory = Callable[[], Any]


def load_data(
    data: DataConfig,
    *,
    eval_size: int | None,
    seed: int,
    make_env: EnvFactory | None = None,
    env_args: Mapping[str, Any] | None = None,
    answer_needed_by: str | None = None,
) -> tuple[Task | None, list[Sample], list[Sample]]:
    """The run's task (None for a file or a game), its `data.train_size` training problems drawn with
    `seed` (`run.seed`), and its `eval_size` (`eval.size`; None: `data.eval_size`) held-out ones.
    A dataset's rows may lack an answer (TRL's prompt-only rows) unless `answer_needed_by` names what in
    the recipe reads it (`answer_needed_by_recipe(cfg)`): then a row without one is an error naming it."""
    needs = answer_needed_by
    n_eval = eval_size or data.eval_size
    args = dict(env_args or {})
    if make_env is not None and data.task is None and data.source is None:  # a self-contained game
        game = type(make_env())
        train = game.make_samples(data.train_size, seed, "train", **args)
        return None, train, held_out_samples(data, None, n_eval, make_env=make_env, env_args=args)
    check_has_prompts(data, has_env=make_env is not None)
    task = load_task(data)
    if task is not None:
        train = task.train_samples(data.train_size, seed=seed)
        return task, train, held_out_samples(data, task, n_eval)
    assert data.source is not None
    if data.eval_source is None:
        train, held = split_source(data, answer_needed_by=needs, say=True)
        return None, train, held[:n_eval]
    train = load_samples(data.source, split="train", **_dataset_fields(data, needs))
    return (
        None,
        train,
        held_out_samples(data, None, n_eval, make_env=make_env, env_args=args, answer_needed_by=needs),
    )


def load_recipe_data(
    cfg: HoneConfig, make_env: EnvFactory | None, *, env_reads_answer: bool = True
) -> tuple[Task | None, list[Sample], list[Sample]]:
    """`load_data` as a recipe asks: its data section, eval size, seed and environment, and a reference
    answer required only when something in it reads one (`answer_needed_by_recipe`; `env_reads_answer`:
    whether its environment does, `hone.envs.env_reads_answer`)."""
    return load_data(
        cfg.data,
        eval_size=cfg.eval.size,
        seed=cfg.run.seed,
        make_env=make_env,
        env_args=cfg.env.args,
        answer_needed_by=answer_needed_by_recipe(cfg, env_reads_answer=env_reads_answer),
    )


def split_source(
    data: DataConfig, *, answer_needed_by: str | None = None, say: bool = False
) -> tuple[list[Sample], list[Sample]]:
    """`data.source` split in two when there is no `data.eval_source`: the held-out problems (at most
    `data.eval_size`, at most `HOLD_OUT_SHARE` of the rows), ordered by a hash of the problem, each once,
    and the rest in file order. A hash, not a shuffle: the split is the same for every seed and run, and the
    same row always falls on the same side. A row that repeats a held-out problem is dropped, so eval never
    scores a problem the run trained on, nor one problem twice. `say`: log the split, drops counted."""
    assert data.source is not None
    rows = load_samples(data.source, split="train", **_dataset_fields(data, answer_needed_by))
    n_held = min(data.eval_size, int(len(rows) * HOLD_OUT_SHARE))
    if n_held < 1:
        raise HoneDataError(
            f"{data.source}: {len(rows)} rows are too few to hold out {round(100 * HOLD_OUT_SHARE)}% for "
            "eval; set data.eval_source to a held-out file"
        )
    keys = [problem_key(s) for s in rows]
    digests = [hashlib.sha256(json.dumps(key).encode()).hexdigest() for key in keys]
    held: list[Sample] = []
    held_keys: set[tuple[str | None, ...]] = set()
    for i in sorted(range(len(rows)), key=lambda i: (digests[i], i)):
        if len(held) == n_held:
            break
        if keys[i] not in held_keys:
            held.append(rows[i])
            held_keys.add(keys[i])
    train = [s for s, key in zip(rows, keys, strict=True) if key not in held_keys]
    if say:
        repeats = len(rows) - len(train) - len(held)
        log.info(
            "data.eval_source not set: holding out %d of the %d rows of %s for eval (the problems with the "
            "smallest hash of prompt and answer: at most %d%%, at most data.eval_size %d)%s; training on %d",
            len(held),
            len(rows),
            data.source,
            round(100 * HOLD_OUT_SHARE),
            data.eval_size,
            f"; {repeats} more rows repeat a held-out problem and are left out of both" if repeats else "",
            len(train),
        )
    return train, held


def load_task(data: DataConfig) -> Task | None:
    """The task `data.task` or a `reasoning_gym:<name>` source names; None for a dataset or a game."""
    if data.task is not None:
        return get_task(data.task, **data.task_args)
    if data.source is not None and data.source.startswith(GYM_PREFIX):
        return ReasoningGymTask(data.source.removeprefix(GYM_PREFIX), data.args)
    return None


def held_out_samples(
    data: DataConfig,
    task: Task | None,
    n: int,
    *,
    make_env: EnvFactory | None = None,
    env_args: Mapping[str, Any] | None = None,
    at_most: bool = False,
    answer_needed_by: str | None = None,
) -> list[Sample]:
    """The first `n` problems of the run's held-out stream, which it never trains on: the task's or the
    game's eval split (drawn with `EVAL_SEED`), the rows of `data.eval_source`, or those held out of
    `data.source` (`split_source`). A longer stream starts
    with a shorter one, so the eval set and SFT validation take consecutive, disjoint stretches of it.
    A task whose eval split has fewer than `n` distinct problems is an error, or with `at_most` gives
    the ones it has (a game's split and a file's rows never fail for being short)."""
    if task is not None:
        return task.eval_samples(n, EVAL_SEED, at_most=at_most)
    if make_env is not None and data.source is None:
        return type(make_env()).make_samples(n, EVAL_SEED, "eval", **(env_args or {}))
    if data.eval_source is None:
        return split_source(data, answer_needed_by=answer_needed_by)[1][:n]
    fields = _dataset_fields(data, answer_needed_by)
    return load_samples(data.eval_source, split="test", limit=n, **fields)


def validation_samples(
    data: DataConfig,
    task: Task | None,
    train: list[Sample],
    eval_set: list[Sample],
    *,
    val_size: int,
    make_env: EnvFactory | None = None,
    env_args: Mapping[str, Any] | None = None,
    answer_needed_by: str | None = None,
) -> list[Sample]:
    """SFT's validation problems: the `val_size` (`sft.val_size`) held-out problems that follow the eval
    set, less any that repeat a training or eval problem. Early stopping then sees neither an RL training
    prompt nor a problem the final eval scores. A held-out split with fewer problems (a small task, a tiny
    game, a short eval file) validates on those it has beyond the eval set, or, with none, on eval
    problems; each with a warning."""
    n = len(eval_set) + val_size
    stream = held_out_samples(
        data, task, n, make_env=make_env, env_args=env_args, at_most=True, answer_needed_by=answer_needed_by
    )
    stream = stream[len(eval_set) :]
    seen = {problem_key(s) for s in [*train, *eval_set]}
    fresh = [s for s in stream if problem_key(s) not in seen]
    if fresh:
        if len(fresh) < val_size:
            log.warning(
                "SFT validation: the held-out split has only %d problems beyond the eval set's %d that "
                "repeat no training or eval problem (sft.val_size %d); validating on those",
                len(fresh),
                len(eval_set),
                val_size,
            )
        return fresh
    log.warning(
        "SFT validation: the held-out split has no problems beyond the eval set's %d; validating on "
        "eval problems (early stopping sees the eval set)",
        len(eval_set),
    )
    return (stream or eval_set)[:val_size]


def problem_key(sample: Sample) -> tuple[str | None, ...]:
    """What makes two samples the same problem: the question, its images and its reference answer (not the
    id). Images count: "How many shapes?" over two pictures is two problems. A text-only sample's key has
    no images element, so its hash (and which rows a file holds out) is what it was before images."""
    messages = None if sample.messages is None else json.dumps(sample.messages, sort_keys=True, default=str)
    if not sample.images:
        return sample.prompt, messages, sample.answer
    return sample.prompt, messages, sample.answer, json.dumps([image_key(i) for i in sample.images])


def _dataset_fields(data: DataConfig, answer_needed_by: str | None = None) -> dict[str, Any]:
    return dict(
        prompt_field=data.prompt_field,
        answer_field=data.answer_field,
        messages_field=data.messages_field,
        image_field=data.image_field,
        subset=data.subset,
        require_answer=answer_needed_by is not None,
        answer_needed_by=answer_needed_by,
    )


def answer_needed_by_recipe(cfg: HoneConfig, *, env_reads_answer: bool = True) -> str | None:
    """What in the recipe reads a dataset row's reference answer (`data.answer_field`), named as the recipe
    names it ("reward.fn math", "reward.components.acc (fn math)", "env.name retry"); None when nothing
    does, so TRL's prompt-only rows load. The `math` verifier compares against the answer unless its
    `answer_field` arg points it at another column; an environment may check it (Hone's games do), so
    one is kept as needing it unless `env_reads_answer` says it does not (a TRL environment reads the
    row's columns: `hone.envs.env_reads_answer`). Rewards that take no answer (format, length, overlong,
    code's tests column, judge's optional reference, reward_model, a `pkg.mod:fn` plugin) need none."""
    components = cfg.reward.components
    for name, c in cfg.reward.resolved().items():
        if c.fn == "math" and not c.args.get("answer_field"):
            return f"reward.components.{name} (fn math)" if components else "reward.fn math"
    if cfg.env.name is not None and env_reads_answer:
        return f"env.name {cfg.env.name}"
    return None


def check_has_prompts(data: DataConfig, *, has_env: bool) -> None:
    if data.task is None and data.source is None and not has_env:
        raise HoneDataError(
            "data: set data.source (your jsonl/parquet file or a hub dataset), data.task (a built-in "
            "task, e.g. arithmetic), or env.name (an environment that makes its own problems)"
        )


def check_data_files(data: DataConfig, *, has_env: bool, answer_needed_by: str | None = None) -> None:
    """Check that the run has prompts, and read the first row of each local data file (`data.source`,
    `data.eval_source`) with the recipe's fields, so a wrong path or field name fails in a second, before a
    model loads. A hub name or a `prefix:name` source is left to the run (reading it may mean a download)."""
    check_has_prompts(data, has_env=has_env)
    fields = _dataset_fields(data, answer_needed_by)
    for key, source in (("data.source", data.source), ("data.eval_source", data.eval_source)):
        if source is None or ":" in source:
            continue
        path = Path(source).expanduser()
        if not (path.exists() or path.is_absolute() or path.suffix in (".jsonl", ".json", ".parquet")):
            continue
        try:
            load_samples(source, limit=1, **fields)
        except HoneDataError as e:
            raise HoneDataError(f"{key}: {e}") from None

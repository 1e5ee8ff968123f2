"""`hone` command line: train, sft, eval, pairs, dpo, rm.

hone train [RECIPE] [section.key=value ...]     (no recipe: the embedded default)
hone train --resume runs/<name> [overrides]     (sft, dpo and rm too; each takes --dry-run as well)
hone sft [RECIPE] [overrides]                  (SFT only; the model lands in runs/<name>/sft)
hone eval [RECIPE] --model PATH [overrides]    (greedy accuracy; eval.n / eval.k for pass@k)
hone pairs [RECIPE] [overrides]                (preference pairs labelled by the recipe's reward)
hone dpo [RECIPE] [overrides]                  (no recipe: dpo; DPO on dpo.data, model in runs/<name>/model)
hone rm [RECIPE] [overrides]                   (no recipe: rm; reward model on rm.data, runs/<name>/model)
hone collect RECIPE --policy P --episodes N --dataset-id ID --out ROOT   (a Minari dataset, offline RL)
hone serve tinker [--host H] [--port P] [RECIPE] [overrides]   (the Tinker REST API; model.* are its defaults)
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hone.cli.parser import flags_as_settings
from hone.cli.parser import parser as _parser
from hone.cli.serve import serve_tinker
from hone.config import ConfigError, HoneConfig, load_config
from hone.data.errors import HoneDataError
from hone.data.splits import answer_needed_by_recipe, check_data_files
from hone.errors import HoneError
from hone.signals import signals_interrupt

if TYPE_CHECKING:
    from hone.preference.commands import PreferenceRunResult
    from hone.rl.loop import RunResult, Setup
    from hone.training.distributed import Ranks


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _config(ns: argparse.Namespace) -> HoneConfig:
    recipe, overrides = _split(ns.args)
    if getattr(ns, "resume", None):
        if recipe is not None:
            raise ConfigError("--resume takes the run's saved config; pass overrides only")
        saved = Path(ns.resume) / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"--resume {ns.resume}: no config.yaml there (is it a run directory?)")
        run_dir = Path(ns.resume)
        overrides = [f"run.dir={run_dir.parent}", f"run.name={run_dir.name}", *overrides]
        return load_config(saved, overrides, relative_to=Path.cwd())
    if getattr(ns, "trl_config", None):
        if recipe is not None:
            raise ConfigError(f"--trl-config {ns.trl_config} is the recipe: drop {recipe!r} or --trl-config")
        from hone.cli.trl_config import trl_recipe_config

        return trl_recipe_config(ns.trl_config, overrides)
    if recipe is None and ns.command in ("dpo", "rm"):  # the default recipe trains no preferences
        recipe = ns.command
    if ns.command == "eval":  # --run, or a model inside a run directory: the run's own config.yaml
        from hone.cli.eval_run import eval_config

        return eval_config(recipe, overrides, run=ns.run, step=ns.step, model=ns.model)
    return load_config(recipe, overrides)


def _show_config(ns: argparse.Namespace, cfg: HoneConfig) -> int:
    from hone.config.reference import commented_yaml
    from hone.version import version_line

    header = [f"{version_line()}: hone config {' '.join(ns.args)}".rstrip()]
    print(commented_yaml(cfg, header), end="")
    return 0


def _summary(result: RunResult, seconds: float) -> str:
    from hone.rl.report import run_summary

    return run_summary(result, seconds)


RankedHandler = Callable[[argparse.Namespace, HoneConfig, "Ranks"], int]


def _on_ranks(handler: RankedHandler) -> Callable[[argparse.Namespace, HoneConfig], int]:
    """A training command on `trainer.world_size` learner ranks: unlaunched, this process starts the ranks
    and only watches them; a rank (or the one process) runs `handler` in the ranks' process group."""

    def run(ns: argparse.Namespace, cfg: HoneConfig) -> int:
        from hone.rl.ranks.launch import world_size

        world = world_size(cfg)
        if world > 1 and "RANK" not in os.environ:
            return _launch(ns, cfg, world)
        from hone.rl.ranks.learners import joined_ranks

        with joined_ranks(cfg, world) as ranks:
            return handler(ns, cfg, ranks)

    return run


def _train(ns: argparse.Namespace, cfg: HoneConfig, ranks: Ranks, setup: Setup | None = None) -> int:
    from hone.rl.loop import train

    if ranks.rank > 0:
        return _follow(cfg, ranks)
    if ns.init:
        raise ConfigError("--init: control runs with an offline algorithm only (language models: model.path)")
    if ns.dry_run:
        from hone.cli.dry_run import dry_run

        dry_run(cfg)
        return 0
    started = time.perf_counter()
    result = train(cfg, resume=bool(ns.resume), ranks=ranks, setup=setup)
    print(_summary(result, time.perf_counter() - started))
    from hone.rl.report import nothing_learned

    warning = nothing_learned(result.tally)
    if warning:  # the run worked, but taught nothing: loud, on stderr (the exit code stays 0)
        print(warning, file=sys.stderr)
    return 0


def _train_control(ns: argparse.Namespace, cfg: HoneConfig) -> int:
    """`hone train` of a `control:` recipe: one process, no language-model code loaded."""
    from hone.control.loops import control_summary, train_control

    assert cfg.control is not None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: every rank would train the same run
        raise ConfigError("control: runs in one process; start it without torchrun (WORLD_SIZE > 1)")
    started = time.perf_counter()
    init = Path(ns.init) if ns.init else None
    result = train_control(cfg, bool(ns.resume), init, dry_run=bool(ns.dry_run))
    if isinstance(result, str):  # --dry-run: what a start found; nothing was written
        print(f"{cfg.control.algorithm} on {cfg.control.env}: {result}")
        print("dry run: recipe, environment, networks (and dataset) are fine; nothing was trained or written")
        return 0
    print(control_summary(result, time.perf_counter() - started))
    return 0


def _follow(cfg: HoneConfig, ranks: Ranks) -> int:
    from hone.rl.ranks.learners import follow

    follow(cfg, ranks)
    return 0


def _launch(ns: argparse.Namespace, cfg: HoneConfig, world: int) -> int:
    from hone.rl.ranks.launch import check_devices, launch
    from hone.run.lifecycle import where_stopped

    check_devices(cfg, world)
    code, line = launch(ns.argv, world)
    if line is not None:
        rank_failed = line.startswith("learner rank ")
        if rank_failed:
            line = f"{line}; {where_stopped(Path(cfg.run.dir) / cfg.run.name, ns.command)}"
        print(f"hone: {'error: ' if code == 2 else ''}{line}", file=sys.stderr)
    return code


def _offline_dry_run(ns: argparse.Namespace, cfg: HoneConfig) -> int:
    """`hone sft|dpo|rm --dry-run`: the checks a start makes, in one process; nothing written."""
    from hone.cli.dry_run import dry_run_dpo, dry_run_rm, dry_run_sft

    if ns.resume:
        raise ConfigError("--dry-run checks a new run; drop --resume")
    {"sft": dry_run_sft, "dpo": dry_run_dpo, "rm": dry_run_rm}[ns.command](cfg)
    return 0


def _sft(ns: argparse.Namespace, cfg: HoneConfig, ranks: Ranks) -> int:
    from hone.rl.sft_run import run_sft_recipe

    cfg.sft.enabled = True  # SFT alone: no RL step follows
    cfg.run.steps = 0
    if ranks.rank > 0:
        return _follow(cfg, ranks)
    result = run_sft_recipe(cfg, resume=bool(ns.resume), ranks=ranks)
    print(f"\nrun directory   {result.run_dir}")
    print(f"SFT steps       {result.steps}")
    print(f"SFT model saved to {result.model_dir}")
    print(f"held-out accuracy after SFT: {100 * result.eval['eval/accuracy']:.1f}%")
    return 0


def _eval(ns: argparse.Namespace, cfg: HoneConfig) -> int:
    if cfg.control is not None:  # a control run's policy: episodes, not prompts
        from hone.control.loops import evaluate_saved

        if ns.ope:
            from hone.control.ope import evaluate_offline

            return _print_metrics(evaluate_offline(cfg), ns.out)
        return _print_metrics(evaluate_saved(cfg), ns.out)
    if ns.ope:
        raise ConfigError("--ope: evaluates a control run's policy on a dataset (a recipe with control:)")
    from hone.cli.eval_run import eval_records
    from hone.envs import release_envs
    from hone.rl.components import close_samplers, setup_components
    from hone.rl.evaluate import EvalSettings, check_rewards_answered, run_eval_rollouts

    parts = setup_components(cfg, reuse_model=True)  # nothing trains the policy: no copy for the sampler
    try:
        result = run_eval_rollouts(parts.evaluation, EvalSettings.of(cfg))
    finally:
        close_samplers(parts)
        release_envs()
    if ns.samples:
        records = eval_records(result.rollouts, parts.policy.tokenizer, parts.eval_samples)
        Path(ns.samples).write_text("".join(json.dumps(record) + "\n" for record in records))
    check_rewards_answered(result, parts.reward, "eval")  # every reward raised: one line, not accuracy 0
    return _print_metrics(result.metrics, ns.out)


def _collect(ns: argparse.Namespace, cfg: HoneConfig) -> int:
    from hone.control.collect import collect

    print(collect(cfg.control, ns, cfg.run.seed))
    return 0


def _print_metrics(metrics: dict[str, float], out: str | None) -> int:
    for key, value in metrics.items():
        print(f"{key:24s} {value:.4f}")
    if out:
        Path(out).write_text(json.dumps(metrics, indent=2))
    return 0


def _pairs(ns: argparse.Namespace, cfg: HoneConfig) -> int:
    from hone.preference.pairs import make_pairs

    try:
        result = make_pairs(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    print(
        f"{result.pairs} pairs from {result.groups_with_pair} of {result.prompts} prompts "
        f"(mean reward {result.mean_reward:.3f}) written to {result.path}"
    )
    return 0


def _dpo(ns: argparse.Namespace, cfg: HoneConfig, ranks: Ranks) -> int:
    from hone.preference.commands import run_dpo_recipe

    result = _preference_run(run_dpo_recipe, ns, cfg, ranks)
    if result is None:
        return 0
    if "rewards/margins" in result.metrics:  # absent when run.time_limit_s ran out before the first step
        accuracy, margin = result.metrics["rewards/accuracies"], result.metrics["rewards/margins"]
        print(f"last step       rewards/accuracies {accuracy:.3f}  rewards/margins {margin:.4f}")
    before, after = result.start_eval.get("eval/accuracy"), result.final_eval.get("eval/accuracy")
    if before is not None and after is not None:
        print(f"held-out accuracy before DPO  {100 * before:5.1f}%")
        print(f"held-out accuracy after DPO   {100 * after:5.1f}%   ({100 * (after - before):+.1f} points)")
    return 0


def _rm(ns: argparse.Namespace, cfg: HoneConfig, ranks: Ranks) -> int:
    from hone.preference.commands import MODEL_DIR, run_rm_recipe

    result = _preference_run(run_rm_recipe, ns, cfg, ranks)
    if result is None:
        return 0
    print(f"held-out pair accuracy  {100 * result.metrics['eval/pair_accuracy']:5.1f}%")
    print(f"use it: reward.fn=reward_model reward.args.path={result.run_dir / MODEL_DIR}")
    return 0


def _preference_run(
    run: Callable[..., PreferenceRunResult], ns: argparse.Namespace, cfg: HoneConfig, ranks: Ranks
) -> PreferenceRunResult | None:
    """`hone dpo` / `hone rm` on every rank; rank 0 prints where the run and its model are and gets the
    result to say the rest, the other ranks None."""
    from hone.preference.commands import MODEL_DIR

    result = run(cfg, ranks, resume=bool(ns.resume))
    if ranks.rank > 0:
        return None
    print(
        "\n".join(
            [
                "",
                f"run directory   {result.run_dir}",
                f"steps           {result.steps}",
                f"model saved to  {result.run_dir / MODEL_DIR}",
            ]
        )
    )
    return result


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """Options may sit between the recipe and its overrides (`hone eval RECIPE --model M k=v`): argparse
    stops filling a `*` positional at the first option, so the words after it are added back here. The
    words themselves are kept (`ns.argv`: what each learner rank is started with)."""
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, extra = parser.parse_known_args(argv)
    ns.argv = argv
    unknown = [a for a in extra if a.startswith("-")]
    if unknown:
        line = flags_as_settings(argv, unknown)  # `--learning_rate 1e-5`: say `trainer.lr=1e-5`
        if line is not None:
            parser.exit(2, f"hone: error: {line}\n")
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    ns.args = [*ns.args, *extra]
    return ns


def main(argv: list[str] | None = None, *, setup: Setup | None = None) -> int:
    """`hone ARGV...` (sys.argv's when None): its exit code. `setup` builds a `hone train` language-model
    run's parts instead of `setup_components`, as `train(setup=...)` does (a program that runs the CLI
    with parts of its own, a test's); the other commands ignore it."""
    ns = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="hone: %(message)s")
    # HTTP clients log every request at INFO: an agent run (rollout.agent) would print one line per model
    # call, an OpenEnv or verifiers run one per poll, each under Hone's prefix.
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if ns.command == "config" and (ns.markdown or ns.schema):
        from hone.config.reference import json_schema, markdown_reference

        print(markdown_reference() if ns.markdown else json_schema(), end="")
        return 0
    try:  # the recipe and data files are checked before any model loads: a typo fails in seconds
        cfg = _config(ns)
        if getattr(ns, "model", None):
            cfg.model.path = ns.model
        if ns.command == "config":
            return 0 if getattr(ns, "trl_config", None) else _show_config(ns, cfg)
        resumed = getattr(ns, "resume", None)
        # (a control run's environment makes its own observations)
        if ns.command in ("train", "sft", "eval", "pairs") and not resumed and cfg.control is None:
            reads = True
            if cfg.env.name is not None:  # imported only for an environment run (transformers comes with it)
                from hone.envs import env_reads_answer

                reads = env_reads_answer(cfg.env.name, cfg.env.args)
            needs = answer_needed_by_recipe(cfg, env_reads_answer=reads)
            check_data_files(cfg.data, has_env=cfg.env.name is not None, answer_needed_by=needs)
    except (ConfigError, HoneDataError) as e:
        return _error(e)
    if cfg.control is None:  # a control run loads no transformers
        # Hone reports its own progress; transformers' per-shard bars would drown it.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    from hone.run.lifecycle import RunInterrupted

    train_lm = _on_ranks(functools.partial(_train, setup=setup))
    handlers = {
        "train": _train_control if cfg.control is not None else train_lm,
        "sft": _on_ranks(_sft),
        "eval": _eval,
        "pairs": _pairs,
        "collect": _collect,
        "serve": serve_tinker,
        "dpo": _on_ranks(_dpo),
        "rm": _on_ranks(_rm),
    }
    if ns.command in ("sft", "dpo", "rm") and ns.dry_run:
        handlers[ns.command] = _offline_dry_run
    with signals_interrupt() as received:
        try:
            return handlers[ns.command](ns, cfg)
        except HoneError as e:  # bad input or a run that cannot go on: one line, no traceback
            return _error(e)
        except (RunInterrupted, KeyboardInterrupt) as e:
            if os.environ.get("HONE_DEBUG"):
                raise
            # Work the interrupt cut short (e.g. a reward call's coroutine, created but never awaited, or
            # a task of an event loop the interrupt closed) is garbage now: its warnings and asyncio's
            # "Task was destroyed but it is pending!" at shutdown would break the one-line promise.
            warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
            line = str(e) or "interrupted"  # a bare Ctrl-C has no message
            _say(f"hone: {line}", line)
            return 128 + received.get("signal", signal.SIGINT)
        except Exception as e:  # a learner rank's unexpected error: its launcher prints the line
            if not os.environ.get("HONE_ERROR_FILE") or os.environ.get("HONE_DEBUG"):
                raise
            return _rank_error(e, Path(cfg.run.dir) / cfg.run.name)


def _error(e: Exception) -> int:
    if os.environ.get("HONE_DEBUG"):
        raise e
    line = _one_line(e)
    _say(f"hone: error: {line}", line)
    return 2


def _rank_error(e: Exception, run_dir: Path) -> int:
    """A learner rank's unexpected error: its traceback to `run_dir/errors/rank-N.txt`, its line to the
    launcher. One raised by a collective another rank broke (its process ended) is marked, so the launcher
    names the rank that failed first."""
    import traceback

    rank = os.environ.get("RANK", "0")
    where = run_dir / "errors" / f"rank-{rank}.txt"
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("".join(traceback.format_exception(e)))
    broken = "Connection closed by peer" in str(e) or "Connection reset by peer" in str(e)
    mark = "collective: " if broken else ""
    Path(os.environ["HONE_ERROR_FILE"]).write_text(
        f"{mark}{type(e).__name__}: {_one_line(e)[:300]} ({where})"
    )
    return 1


def _one_line(e: Exception) -> str:
    """One line, even when a message (a user's reward or plugin error) spans several."""
    return "; ".join(part.strip() for part in str(e).splitlines() if part.strip())


def _say(text: str, line: str) -> None:
    """Print the run's one line; a learner rank started by `hone train` leaves it to its launcher."""
    error_file = os.environ.get("HONE_ERROR_FILE")
    if error_file:
        Path(error_file).write_text(line)
    else:
        print(text, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

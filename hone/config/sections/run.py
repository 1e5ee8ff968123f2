"""`run`, `eval` and `logging`: the run's name, length, cadences and outputs; what its held-out eval samples;
what it writes (TensorBoard, W&B, samples, plots, videos). Every family reads them."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from hone.config.base import Section


class RunConfig(Section):
    name: str = Field(
        "demo",
        description="the run's name: its directory is run.dir/run.name (an existing one is refused unless "
        "--resume)",
    )
    plugins: list[str] = Field(
        default_factory=list, description="modules imported first, e.g. ones that register new algorithms"
    )
    dir: str = Field("runs", description="where run directories go (relative to the current directory)")
    seed: int = Field(
        0,
        description="seeds sampling, data order and initialisation; the same seed and config give the same "
        "run",
    )
    steps: int = Field(200, ge=0, description="RL steps (optimizer rounds of sample → score → update)")
    time_limit_s: float | None = Field(
        None, gt=0, description="wall-time budget of this session (SFT included); RL stops when it is spent"
    )
    save_every: int = Field(
        50,
        ge=0,
        description="checkpoint cadence in steps (RL steps; SFT/DPO/RM optimizer steps); 0 = only at the end",
    )
    keep_last: int | None = Field(
        2, ge=1, description="checkpoints kept on disk (older ones are deleted); null = all"
    )
    eval_every: int = Field(50, ge=0, description="held-out eval cadence in steps; 0 = start and end only")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: all cores)")
    callbacks: list[str] = Field(
        [],
        description="'pkg.module:fn' functions called as fn(step, metrics) after every RL step (and every "
        "SFT/DPO/RM optimizer step), once it is logged and checkpointed (alerts, custom stopping rules): one "
        "that raises ends the run, KeyboardInterrupt as Ctrl-C does",
    )


def check_pass_at_ks(ks: Sequence[int], n: int) -> None:
    """Refuse a pass@k that `n` samples per problem cannot estimate (k outside 1..n): checked before
    anything is sampled, so no pass@k is ever dropped silently. One check for the config (`eval.k`,
    `eval.n`, before any model loads) and for `evaluate` (the library guard)."""
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(
            f"k={bad}: pass@k needs 1 <= k <= eval.n (samples per problem); got k={list(ks)}, n={n}"
        )


class EvalConfig(Section):
    size: int | None = Field(None, ge=1, description="defaults to data.eval_size")
    temperature: float = Field(0.0, ge=0, description="0 = greedy accuracy")
    n: int = Field(1, ge=1, description="samples per problem for pass@k")
    k: list[int] = Field(
        default_factory=lambda: [1], description="the k of each pass@k reported (each ≤ eval.n)"
    )

    @model_validator(mode="after")
    def _k_within_n(self) -> EvalConfig:
        check_pass_at_ks(self.k, self.n)
        return self


class LoggingConfig(Section):
    tensorboard: bool = Field(True, description="TensorBoard events in runs/<name>/tensorboard")
    wandb: bool = Field(False, description="also log to Weights & Biases (the wandb extra)")
    wandb_project: str = Field("hone", description="the W&B project (the run is named run.name)")
    progress: bool = Field(True, description="a progress bar (a plain line every 10 steps off a terminal)")
    # Metrics drawn (one panel each, against step) into runs/<name>/curves.png when the run ends;
    # needs matplotlib (the plot extra), skipped with a warning without it.
    plot: list[str] | None = Field(
        None,
        description="metrics drawn into curves.png when the run ends; null = the family's own (a language "
        "model: reward, eval accuracy, entropy, response length, skipped groups, KL; control: returns, "
        "losses and what each algorithm watches); [] draws nothing",
    )
    samples: int = Field(
        0,
        ge=0,
        description="responses written each logged step to runs/<name>/samples.jsonl and TensorBoard: the "
        "first this many rollouts of the step's batch as sampled (prompt order, before any filter); 0 = off",
    )
    samples_every: int = Field(1, ge=1, description="log samples every this many RL steps")
    video: bool = Field(
        False,
        description="control runs: record the deterministic eval episodes as runs/<name>/videos/"
        "step-<N>-episode-<i>.mp4 (the env's rgb_array rendering; the video extra); a warning and no video "
        "where rendering or the writer is missing",
    )
    video_episodes: int = Field(
        1, ge=1, description="with video: record the first this many episodes of each eval"
    )

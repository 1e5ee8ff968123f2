"""`hone sft`: the SFT warm start as a run of its own, with the run contract every family keeps.

The same SFT as `hone train`'s warm start (`warmstart.warm_start_sft`: the recipe's `sft` section, validation
on held-out problems, `sft.stop_at_accuracy`), in a `RunSession`: its rows go to `metrics.jsonl`, a
checkpoint is written every `run.save_every` SFT steps and where SFT stops (the time limit, Ctrl-C,
SIGTERM), `hone sft --resume RUN` goes on from it to the weights an unbroken run ends with, and the run
ends with the held-out eval (the RL eval's data and reward), `summary.json` and the model in
`runs/<name>/sft` (`model.path=runs/<name>/sft` to go on with RL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.config import HoneConfig
from hone.envs import release_envs
from hone.rl.components import close_samplers, setup_components
from hone.rl.evaluate import EvalSettings, run_eval
from hone.rl.loop import step_callbacks
from hone.rl.ranks.learners import LeadRanks
from hone.rl.warmstart import SFTSettings, sft_data, warm_start_sft
from hone.run.lifecycle import SetupError
from hone.run.session import RunSession
from hone.training.distributed import ONE_RANK, Ranks

SFT_DIR = "sft"  # where the SFT model goes, as `hone train`'s warm start puts it


@dataclass
class SFTRunResult:
    run_dir: Path
    steps: int  # SFT optimizer steps, a resumed run's earlier ones included
    eval: dict[str, float]  # the held-out eval after SFT
    sft: dict[str, Any] = field(default_factory=dict)  # `run_sft`'s result: loss, validation score, ...

    @property
    def model_dir(self) -> Path:
        return self.run_dir / SFT_DIR


def run_sft_recipe(cfg: HoneConfig, *, resume: bool = False, ranks: Ranks = ONE_RANK) -> SFTRunResult:
    """`hone sft` (rank 0 of N learner ranks, whose other ranks `learners.follow` it): SFT, then the eval.
    `resume`: go on from the run's last checkpoint (one learner rank)."""
    if resume and ranks.world > 1:
        raise SetupError(
            f"hone sft --resume: one learner rank only (trainer.world_size={ranks.world}); N ranks save no "
            "SFT checkpoints yet"
        )
    session = RunSession(cfg.run, resume=resume, ranks=ranks, command="sft")
    callbacks = step_callbacks(cfg.run.callbacks)
    lead = LeadRanks(ranks) if ranks.world > 1 else None  # first: the other ranks wait on its commands
    parts = setup_components(cfg)
    if lead is not None:
        lead.attach(cfg, parts)
    try:
        try:
            data = sft_data(cfg, parts)
        except (ValueError, OSError) as e:
            raise SetupError(str(e)) from e
        model = {"model/": parts.policy}
        resumed_at = None if session.latest is None else session.restore(model)["step"]  # before any write
        with session.open_log(cfg, resumed_at) as metrics_log, session.interrupts():

            def on_row(row: dict[str, float]) -> None:
                metrics_log.log(int(row["step"]), {k: v for k, v in row.items() if k != "step"})

            result = warm_start_sft(
                SFTSettings.of(cfg),
                parts.policy,
                parts.sampler,
                data,
                parts.reward,
                session.dir / SFT_DIR,
                parts.episodes,
                deadline=session.deadline,
                weights=parts.weights,
                on_ranks=lead,
                saves=session.fit_saves(model, callbacks=callbacks),
                on_row=on_row,
            )
            evaluated = run_eval(
                parts.evaluation, EvalSettings.of(cfg)
            )  # the SFT weights, published as it ended
            metrics_log.log(int(result["steps"]), evaluated)
        if lead is not None:
            lead.stop()
        session.plot(cfg.logging, ["sft/loss", "sft/eval"])
        session.finish(
            {"family": "sft", "steps": result["steps"], "model": str(session.dir / SFT_DIR)}
            | {"eval": evaluated, "sft": result}
        )
        return SFTRunResult(session.dir, int(result["steps"]), evaluated, dict(result))
    finally:
        close_samplers(parts)
        release_envs()

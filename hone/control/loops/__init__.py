"""The control loops, one per kind of learning, picked by the algorithm's registration
(`hone.control.algos`): `onpolicy` (PPO; MAPPO/IPPO on a team), `offpolicy` (SAC/TD3), `offline` (BC,
TD3+BC, IQL, AWR, CQL and offline-to-online). Each stands on the run session every family shares
(`hone.run.session`); `train_control` is what `hone train` calls with a `control:` recipe."""

from __future__ import annotations

from pathlib import Path

from hone.config import HoneConfig
from hone.control.algos import check_algorithm
from hone.control.envs import ControlEnvError
from hone.control.evaluate import ControlResult
from hone.control.loops.offline import train_offline
from hone.control.loops.offpolicy import train_offpolicy
from hone.control.loops.onpolicy import train_onpolicy
from hone.control.multiagent import ParallelBatch, SharedActorCritic, evaluate_team, is_multi_agent
from hone.control.policy_io import evaluate_saved as evaluate_saved_single
from hone.control.policy_io import load_saved


def train_control(
    cfg: HoneConfig, resume: bool = False, init: Path | None = None, *, dry_run: bool = False
) -> ControlResult | str:
    """Train (or with `resume`, go on from the newest checkpoint of) the control run `cfg`; `init`: an
    offline run whose final learner the run starts from (offline-to-online). With `dry_run`: everything a
    start checks (the algorithm and its keys, the environment and its spaces, the networks, the dataset),
    then a line saying what was found; nothing is written."""
    control = cfg.control
    assert control is not None
    algorithm = check_algorithm(cfg)  # every impossible combination: one line, before anything is built
    if algorithm.loop == "offline":
        return train_offline(cfg, algorithm, init=init, resume=resume, dry_run=dry_run)
    if init is not None:
        raise ControlEnvError(
            f"--init: starts an offline algorithm (bc, td3_bc, iql, awr, cql) from an offline run, not "
            f"control.algorithm {control.algorithm}"
        )
    if algorithm.loop == "offpolicy":
        return train_offpolicy(cfg, algorithm, resume=resume, dry_run=dry_run)
    return train_onpolicy(cfg, algorithm, resume=resume, dry_run=dry_run)


def evaluate_saved(cfg: HoneConfig) -> dict[str, float]:
    """`hone eval` of a control run's policy (`model.path`: its `model/` folder, which `--run` finds)."""
    control = cfg.control
    assert control is not None
    folder = Path(cfg.model.path)
    if not is_multi_agent(control.env):
        return evaluate_saved_single(control, folder)
    env = ParallelBatch(control, 1, centralized=control.ppo.multi_agent_critic == "centralized")
    env.close()
    policy = SharedActorCritic(
        env.obs_dim, env.critic_dim, env.single_action_space, control.hidden_sizes, control.activation
    )
    normalizer = load_saved(control, folder, policy, env.obs_dim + env.critic_dim, rows=env.num_rows)
    return evaluate_team(policy, control, normalizer)


def control_summary(result: ControlResult, seconds: float) -> str:
    """The lines `hone train` prints at a control run's end, in its own terms."""
    before, after = result.start_eval["eval/return"], result.final_eval["eval/return"]
    steps = f"{result.steps} ({result.env_steps} environment steps)"
    if result.updates:  # offline: gradient updates on the dataset, then any online steps
        online = f", then {result.env_steps} online environment steps" if result.env_steps else ""
        steps = f"{result.steps} ({result.updates} updates on the dataset{online})"
    stopped = {"time limit": "  (run.time_limit_s reached)", "stop_at_return": "  (control.stop_at_return)"}
    return "\n".join(
        [
            "",
            f"run directory   {result.run_dir}",
            f"RL steps        {steps}{stopped.get(result.stopped_by, '')}",
            f"wall time       {seconds:.0f} s",
            f"eval return before  {before:.1f}",
            f"eval return after   {after:.1f}   ({after - before:+.1f})",
            *(
                [f"normalized score    {result.final_eval['eval/normalized_score']:.1f}"]
                if "eval/normalized_score" in result.final_eval
                else []
            ),
        ]
    )


__all__ = ["control_summary", "evaluate_saved", "train_control"]

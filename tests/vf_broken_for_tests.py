"""A verifiers environment whose episodes fail (its `run` raises): the adapter counts them in env/errors."""

from __future__ import annotations

import verifiers.v1 as vf

from tests.vf_envs_for_tests import SumTaskset


class BrokenEnv(vf.Env[vf.SingleAgentEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        raise RuntimeError("the game server is down")


__all__ = ["BrokenEnv", "SumTaskset"]

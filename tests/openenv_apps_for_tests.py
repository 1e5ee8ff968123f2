"""OpenEnv apps for tests/test_openenv.py that Hone starts as processes (`env.args.app`): the guess_number
port as the published apps serve by default, one session at a time."""

from __future__ import annotations

from openenv.core.env_server import create_app

from hone.envs.openenv_games import GuessAction, GuessNumberEnvironment, GuessObservation

one_session = create_app(GuessNumberEnvironment, GuessAction, GuessObservation, env_name="guess_number")

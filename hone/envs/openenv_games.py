"""`guess_number` as an OpenEnv server, written with openenv-core's server API (`openenv-core`, the
`agents` extra): serve it with `uvicorn hone.envs.openenv_games:app --port 8000`, or let Hone start it
(`env.args.app: hone.envs.openenv_games:app`, README "OpenEnv environments").

The rules are the built-in `hone.envs.games.GuessNumber`'s, played by that very class inside the
server, so a run through the OpenEnv adapter and one on the built-in game differ only in the transport
(the comparison the README's table makes). What crosses the wire:

* reset(secret, high, slack, shaping, seed): the game's constructor arguments and the secret; the
  adapter sends a Hone sample's `meta` ({secret, high}) plus `env.args.reset_args`. Without a secret the
  server draws one from `seed`, so the server also plays on its own.
* action `GuessAction.message`: the assistant's reply as text; the game reads the first integer in it.
* observation `GuessObservation.message`: the prompt after reset, then "higher"/"lower"/"Reply with a
  number." (empty when solved); `reward` and `done` as the game gives them; `solved` and `invalid`, the
  game's info, which the adapter sums into `env/solved` and `env/invalid` (`info_fields`).
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server import Action, Observation, State, create_app
from openenv.core.env_server import Environment as OpenEnvEnvironment

from hone.envs.games import GuessNumber
from hone.types import Sample

# WebSocket sessions the server holds at once: one per live episode, so at least
# `data.prompts_per_step * rollout.n` (128 in `agent-guess`), more for an eval of more games.
MAX_SESSIONS = 1024


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    message: str = ""
    solved: float = 0.0
    invalid: float = 0.0


class GuessNumberEnvironment(OpenEnvEnvironment[GuessAction, GuessObservation, State]):
    """One session's game. Sessions share nothing, so the server may hold many at once."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._game: GuessNumber | None = None
        self._state = State(step_count=0)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        secret: int | None = None,
        high: int = 32,
        slack: int = 1,
        shaping: float = 0.0,
        **kwargs: Any,
    ) -> GuessObservation:
        if kwargs:  # a misspelt reset argument must not be dropped in silence
            raise ValueError(f"guess_number: unknown reset arguments {sorted(kwargs)}")
        self._game = GuessNumber(high=high, slack=slack, shaping=shaping)
        if secret is None:
            secret = random.Random(seed).randint(1, high)
        messages = self._game.reset(Sample(id=episode_id or "", meta={"secret": secret, "high": high}))
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message=_text(messages))

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        if self._game is None:
            raise RuntimeError("guess_number: step before reset")
        result = self._game.step(action.message)
        self._state.step_count += 1
        return GuessObservation(
            message=_text(result.messages),
            reward=result.reward,
            done=result.done,
            solved=result.info.get("solved", 0.0),
            invalid=result.info.get("invalid", 0.0),
        )

    @property
    def state(self) -> State:
        return self._state


def _text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m["content"]) for m in messages)


app = create_app(
    GuessNumberEnvironment,
    GuessAction,
    GuessObservation,
    env_name="guess_number",
    max_concurrent_envs=MAX_SESSIONS,
)

"""The built-in `guess_number` game (`hone.envs.games.GuessNumber`) written as a verifiers 0.4 environment:
plain verifiers code (it imports nothing from Hone), trained through the adapter with
`env.name: verifiers:hone.envs.vf_guess_number` (recipe `agent-guess-verifiers`).

Same rules: a secret in 1..high; the first integer in a reply is the guess, answered "higher" or "lower"
(as the user); a reply without one gets "Reply with a number." and still uses a turn; the game ends on the
right guess or after high.bit_length() + slack guesses. The rubric: `found` (weight 1), 1.0 when the secret
was guessed; the metric `invalid` counts replies without a number. Tasks: every secret in shuffled cycles,
drawn as `GuessNumber.make_samples` draws them (same split and seed, same order). `GuessTask.demonstration`
is a Hone extension verifiers ignores: the scripted games of the SFT warm start, the very games the built-in
plays (its guesses are seeded by `demo_key`, named as the built-in names its samples), so the two recipes
start RL from the same weights.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator
from typing import Literal

import verifiers.v1 as vf

_INTEGER = re.compile(r"-?\d+")


class GuessConfig(vf.TasksetConfig):
    high: int = 32
    slack: int = 1
    demo_spread: float = 0.0  # demonstrations guess uniformly in the middle `demo_spread` of the interval
    split: Literal["train", "eval"] = "train"
    seed: int = 0


class GuessData(vf.TaskData):
    secret: int
    high: int
    slack: int
    demo_spread: float = 0.0
    demo_key: str = ""  # seeds the scripted game's guesses; keyed as the built-in game keys its samples

    @property
    def max_turns(self) -> int:
        return self.high.bit_length() + self.slack


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        return float(trace.info.get("found", False))

    @vf.metric
    async def invalid(self, trace: vf.Trace) -> float:
        return float(trace.info.get("invalid", 0))

    def demonstration(self) -> list[dict]:
        """A scripted game that finds the secret (bisection, or a guess from the middle `demo_spread`)."""
        data = self.data
        rng = random.Random(f"guess_number/demo/{data.demo_key}")
        messages = [{"role": "user", "content": _prompt(data.high)}]
        low, high = 1, data.high
        while True:
            mid, half = (low + high) // 2, round(data.demo_spread * (high - low) / 2)
            guess = rng.randint(max(low, mid - half), min(high, mid + half))
            messages.append({"role": "assistant", "content": str(guess)})
            if guess == data.secret:
                return messages
            low, high = (guess + 1, high) if guess < data.secret else (low, guess - 1)
            messages.append({"role": "user", "content": "higher" if guess < data.secret else "lower"})


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    INFINITE = True

    def load(self) -> Iterator[GuessTask]:
        config = self.config
        if config.high < 2 or config.slack < 0:
            raise ValueError(
                f"guess_number: need high >= 2 and slack >= 0, got {config.high}, {config.slack}"
            )
        secrets = list(range(1, config.high + 1))
        rng = random.Random(f"guess_number/{config.split}/{config.seed}")
        for cycle in itertools.count():
            rng.shuffle(secrets)
            for i, secret in enumerate(list(secrets)):
                data = GuessData(
                    prompt=_prompt(config.high),
                    secret=secret,
                    high=config.high,
                    slack=config.slack,
                    demo_spread=config.demo_spread,
                    demo_key=f"guess_number-{config.split}-{config.seed}-{cycle * config.high + i}",
                )
                yield GuessTask(data, config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    """The game engine plays the user, as verifiers' TextArena environment does."""

    async def run(self, task: GuessTask, agents: vf.Agents) -> None:
        data = task.data
        async with agents.player.interaction(task) as interaction:
            trace = interaction.trace
            segment = await interaction.turn()
            for turn in range(1, data.max_turns + 1):
                match = _INTEGER.search(segment.last_reply)
                if match is None:
                    trace.info["invalid"] = trace.info.get("invalid", 0) + 1
                    reply = "Reply with a number."
                elif _parse_int(match.group()) == data.secret:
                    trace.info["found"] = True
                    return
                else:
                    reply = "higher" if _parse_int(match.group()) < data.secret else "lower"
                if turn == data.max_turns:
                    return
                segment = await interaction.turn(reply)


def _prompt(high: int) -> str:
    return f"Guess my number (1-{high})."


def _parse_int(digits: str) -> int:
    return int(digits) if len(digits) <= 18 else (-(10**18) if digits.startswith("-") else 10**18)


__all__ = ["GuessEnv", "GuessTaskset"]

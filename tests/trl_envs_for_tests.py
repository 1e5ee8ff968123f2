"""TRL environment classes as TRL 1.16's GRPOTrainer docs write them (`environment_factory=...`), imported
by the tests by dotted path (`env.name: tests.trl_envs_for_tests:CounterEnv`): nothing here knows Hone.
Class attributes record what the trainer did with them (reset's keyword arguments), for the tests to read."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar


class CounterEnv:
    """The docs' counter: the row's `target` column says where to go; the episode is won on reaching it."""

    resets: ClassVar[list[dict[str, Any]]] = []  # every reset's keyword arguments, in order

    def reset(self, target: int, **kwargs: Any) -> str | None:
        CounterEnv.resets.append({"target": target, **kwargs})
        self.counter = 0
        self.target = target
        self.calls: list[str] = []
        return f" Reach {target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        if step <= 0:
            raise ValueError("step must be positive")
        self.calls.append(f"increment({step})")
        self.counter += step
        return self.counter

    def double(self) -> int:
        """
        Double the counter.

        Returns:
            The updated counter value.
        """
        self.calls.append("double()")
        self.counter *= 2
        return self.counter

    async def note(self, text: str) -> None:
        """
        Write a note beside the counter.

        Args:
            text: The note.
        """
        await asyncio.sleep(0)
        self.calls.append(f"note({text})")

    @property
    def done(self) -> bool:  # a property: never a tool, never evaluated while tools are listed
        raise AssertionError("a property was evaluated")

    def _secret(self) -> int:  # private: not a tool
        return self.target


class WordEnv:
    """A word game with an async `get_reward` and a tool that raises once the game is over."""

    def reset(self, **kwargs: Any) -> str:
        self.word, self.tries, self.won = "cat", 0, False
        return "Guess the three-letter word."

    async def get_reward(self) -> float:
        await asyncio.sleep(0)
        return 1.0 if self.won else -0.5 * self.tries

    def guess(self, word: str) -> str:
        """
        Guess the word.

        Args:
            word: A three-letter word.

        Returns:
            Whether it was right.
        """
        if self.won or self.tries >= 3:
            raise ValueError("Game over.")
        self.tries += 1
        self.won = word == self.word
        return "right" if self.won else "wrong"


class EchoEnv:
    """No `get_reward` and no observation: the reward functions read its state (`environments=`)."""

    def reset(self, **kwargs: Any) -> None:
        self.echoed = ""

    def echo(self, message: str) -> str:
        """
        Echo a message.

        Args:
            message: The message.
        """
        self.echoed = message
        return message


def reached(environments: list[Any], **kwargs: Any) -> list[float]:
    """A TRL reward reading each completion's environment."""
    return [float(env.counter == env.target) for env in environments]


def target_reward(environments: list[Any], target: list[int], **kwargs: Any) -> list[float]:
    """Reads the environment's state and the dataset column it was reset from: the two must agree."""
    assert [env.target for env in environments] == target
    return [float(env.target) for env in environments]


class NoReset:
    def play(self, move: str) -> str:
        """
        Play.

        Args:
            move: The move.
        """
        return move


class Undocumented:
    def reset(self, **kwargs: Any) -> None:
        pass

    def act(self, x):  # type: ignore[no-untyped-def]  # no hints, no docstring: TRL refuses it too
        return x


def make_counter() -> CounterEnv:
    """A factory function, as `environment_factory=` takes one."""
    return CounterEnv()


class LockedCounterEnv(CounterEnv):
    """A counter holding a lock: its instances do not pickle (they cannot travel to a reward worker)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

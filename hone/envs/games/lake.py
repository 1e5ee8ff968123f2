"""The built-in game `frozen_lake`: the FrozenLake grid as RAGEN uses it for multi-turn RL, as text.

See `hone.envs.games` for all the games."""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any

from hone.envs.base import Environment, Message, StepResult, register_env
from hone.envs.games.common import assistant_turn, draw, user_turn
from hone.types import Sample

_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_SHORT = {"u": "up", "d": "down", "l": "left", "r": "right"}
_MOVE_WORD = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
_LAKE_PROMPT = "Reach G, avoid H. Moves: up down left right. You are P."


@register_env("frozen_lake")
class FrozenLake(Environment):
    """RAGEN-style FrozenLake as text: S start, F frozen, H hole, G goal, P the player.

    A reply's move is its first `up`/`down`/`left`/`right` word, or a reply that is just `u`/`d`/`l`/`r`.
    A move off the board leaves the player in place (as in Gymnasium); a reply with no move gets
    "Invalid move." and the board, and uses a turn. Hole: done, reward 0. Goal: done, reward 1.
    """

    max_turns = 10  # for the default 4x4 board: 3 * size - 2

    def __init__(self, size: int = 4, hole_prob: float = 0.2) -> None:
        if not 2 <= size <= 8:
            raise ValueError(f"size must be in 2..8, got {size}")
        if not 0.0 <= hole_prob < 1.0:
            raise ValueError(f"hole_prob must be in [0, 1), got {hole_prob}")
        self.size, self.hole_prob = size, hole_prob
        self.max_turns = _lake_turns(size)
        self.grid: list[str] = []
        self.pos = (0, 0)
        self.turns = 0

    @classmethod
    def make_samples(
        cls, n: int, seed: int, split: str, size: int = 4, hole_prob: float = 0.2, **args: Any
    ) -> list[Sample]:
        def make(rng: random.Random) -> tuple[str, Sample]:
            while True:
                grid = _random_lake(rng, size, hole_prob)
                path = _shortest_path(grid)
                if path is not None and len(path) <= _lake_turns(size):
                    break
            sample = Sample(
                id="", messages=[user_turn(_lake_prompt(grid, _find(grid, "S")))], answer=" ".join(path)
            )
            sample.meta = {"grid": grid}
            return "/".join(grid), sample

        return draw("frozen_lake", n, seed, split, make)

    def reset(self, sample: Sample) -> list[Message]:
        grid = list(sample.meta["grid"])
        _check_lake(grid, sample.id)
        self.grid, self.pos, self.turns = grid, _find(grid, "S"), 0
        self.max_turns = _lake_turns(len(grid))
        return [user_turn(_lake_prompt(grid, self.pos))]

    def step(self, assistant_message: str) -> StepResult:
        self.turns += 1
        out_of_turns = self.turns >= self.max_turns
        move = _parse_move(assistant_message)
        if move is None:
            board = _render(self.grid, self.pos)
            return StepResult(
                [user_turn("Invalid move.\n" + board)], done=out_of_turns, info={"invalid": 1.0}
            )
        dr, dc = _MOVES[move]
        row, col = self.pos[0] + dr, self.pos[1] + dc
        if 0 <= row < len(self.grid) and 0 <= col < len(self.grid[0]):
            self.pos = (row, col)
        cell = self.grid[self.pos[0]][self.pos[1]]
        if cell == "G":
            return StepResult([], reward=1.0, done=True, info={"solved": 1.0})
        if cell == "H":
            return StepResult([], reward=0.0, done=True, info={"fell": 1.0})
        return StepResult([user_turn(_render(self.grid, self.pos))], done=out_of_turns)

    def demonstration(self, sample: Sample) -> list[Message]:
        messages = self.reset(sample)
        path = _shortest_path(self.grid)
        if path is None:
            raise ValueError(f"frozen_lake sample {sample.id!r} has no path from S to G")
        pos = self.pos
        for i, move in enumerate(path):
            messages.append(assistant_turn(move))
            pos = (pos[0] + _MOVES[move][0], pos[1] + _MOVES[move][1])
            if i < len(path) - 1:
                messages.append(user_turn(_render(self.grid, pos)))
        return messages


def _lake_turns(size: int) -> int:
    # Room for the shortest path of every generated map (make_samples keeps only those that fit).
    return 3 * size - 2


def _random_lake(rng: random.Random, size: int, hole_prob: float) -> list[str]:
    cells = [["H" if rng.random() < hole_prob else "F" for _ in range(size)] for _ in range(size)]
    start, goal = rng.sample(range(size * size), 2)
    cells[start // size][start % size] = "S"
    cells[goal // size][goal % size] = "G"
    return ["".join(row) for row in cells]


def _shortest_path(grid: list[str]) -> list[str] | None:
    """BFS from S to G over non-hole cells: the move names, or None if G is unreachable."""
    start = _find(grid, "S")
    came: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if grid[pos[0]][pos[1]] == "G":
            path = []
            while (step := came[pos]) is not None:
                pos, move = step
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in _MOVES.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            inside = 0 <= nxt[0] < len(grid) and 0 <= nxt[1] < len(grid[0])
            if inside and nxt not in came and grid[nxt[0]][nxt[1]] != "H":
                came[nxt] = (pos, move)
                queue.append(nxt)
    return None


def _find(grid: list[str], cell: str) -> tuple[int, int]:
    return next((r, row.index(cell)) for r, row in enumerate(grid) if cell in row)


def _check_lake(grid: list[str], sample_id: str) -> None:
    text = "".join(grid)
    shape_ok = bool(grid) and all(len(row) == len(grid[0]) for row in grid)
    if not shape_ok or set(text) - set("SFHG") or text.count("S") != 1 or text.count("G") != 1:
        raise ValueError(f"frozen_lake sample {sample_id!r}: bad grid {grid} (rows of S F H G, one S, one G)")


def _render(grid: list[str], pos: tuple[int, int]) -> str:
    rows = [list(row) for row in grid]
    rows[pos[0]][pos[1]] = "P"
    return "\n".join("".join(row) for row in rows)


def _lake_prompt(grid: list[str], pos: tuple[int, int]) -> str:
    return f"{_LAKE_PROMPT}\n{_render(grid, pos)}"


def _parse_move(text: str) -> str | None:
    match = _MOVE_WORD.search(text)
    if match:
        return match.group(1).lower()
    return _SHORT.get(text.strip().strip(".!").lower())

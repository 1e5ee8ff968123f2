"""Built-in self-contained environments: each generates its own samples and a scripted solution.

* `tool_arithmetic` — multiply or add 3–4-digit numbers with a calculator tool, then answer. Small
  models get products like 4521*37 wrong by themselves; one calculator call gets them right, so
  reward rises as the policy learns to call the tool and copy its result.
* `guess_number` — a secret in 1..high, replies "higher"/"lower". The secret is in no prompt, so it
  can only be found by reading the observations; binary search solves it in `high.bit_length()`
  guesses. Messages are a few characters each ("16", "higher") so a byte-level model of ~1M
  parameters can play whole episodes.
* `frozen_lake` — the FrozenLake grid as RAGEN (Wang et al. 2025) uses it for multi-turn RL: reach G
  from S without stepping on a hole H, one move per turn, the board re-rendered as text after each
  move. Departures from RAGEN/Gymnasium: never slippery (so a scripted BFS path always solves it and
  rewards are deterministic); S and G are placed at random rather than in opposite corners, so the
  policy must read the board instead of memorising "down, right"; the player is drawn as `P`;
  one action per turn.
* `zoom_digit` — a vision game (a vision-language model plays it): read a digit a few pixels tall in an
  image by asking for crops (`crop X Y`), each answered with the enlarged region as a new image
  observation (MGPO-style), then `answer D`. The example of an environment that returns images.

Samples come from `make_samples(n, seed, split, **args)` (args: the constructor's). Train and eval
splits are disjoint by a hash of the problem itself, as in `hone.data.tasks`; unlike there, both
splits sample with replacement, since `guess_number`'s whole problem space is 32 secrets.
"""

from hone.envs.games.guess import GuessNumber
from hone.envs.games.lake import FrozenLake
from hone.envs.games.retry import ArithmeticRetry
from hone.envs.games.tool_arithmetic import ToolArithmetic
from hone.envs.games.zoom import ZoomDigit

__all__ = ["ArithmeticRetry", "FrozenLake", "GuessNumber", "ToolArithmetic", "ZoomDigit"]

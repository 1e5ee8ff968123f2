"""Atari preprocessing (Mnih et al. 2015, "Human-level control through deep reinforcement learning"; the
details as CleanRL's `ppo_atari.py` and SB3's `atari_wrappers`), built from gymnasium's wrappers:

- `AtariPreprocessing` (Machado et al. 2018): up to 30 no-ops at reset, 4 frames per action with the max of
  the last two (Atari sprites flicker), 84×84 grayscale. It skips the frames itself, so the ALE must not:
  `frameskip=1` is added to `control.env_args` unless the recipe sets it (then the wrapper skips none);
- whole-game episode statistics: `RecordEpisodeStatistics` under the life wrapper, so `episode/return` is
  the game's score, unclipped, as CleanRL reports it;
- an episode per life for training (`EpisodicLife`): a lost life is a terminal state for GAE, but the game
  goes on (the next "reset" is a no-op step) — Mnih et al.'s protocol;
- FIRE at reset for games that wait for it (Breakout), as SB3's `FireResetEnv`;
- training rewards clipped to their sign (Mnih et al.);
- 4 stacked frames, channels first: observations are uint8 (4, 84, 84), the CNN's input.

Evaluation plays whole games with the raw score (`WholeGame`): the same stack without reward clipping, a
lost life continuing the game through the same no-op and FIRE the policy saw in training.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

FRAME_SKIP = 4
FRAME_STACK = 4
ALE_HZ = 60  # the Atari's frame rate: a video of one frame per action plays at ALE_HZ / FRAME_SKIP


def _lives(env: Any) -> int:
    return int(env.unwrapped.ale.lives())


class EpisodicLife(gym.Wrapper):
    """A lost life ends the training episode (terminated); the game itself resets only when it is over
    (SB3's `EpisodicLifeEnv`): `reset` after a lost life is one no-op step."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.lives, self.was_real_done = 0, True

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = bool(terminated or truncated)
        lives = _lives(self.env)
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> Any:
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = _lives(self.env)
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE (then action 2) after each reset, for games that stand still until FIRE (SB3's
    `FireResetEnv`); otherwise a policy that has not learnt to fire sees a frozen screen."""

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, _ = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class WholeGame(gym.Wrapper):
    """Evaluation: one episode is the whole game. A lost life (an `EpisodicLife` end) goes through the same
    pseudo-reset as in training (no-op, FIRE, frame stack refilled) without ending the episode."""

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if (terminated or truncated) and not self.env.get_wrapper_attr("was_real_done"):
            obs, info = self.env.reset()
            terminated = truncated = False
        return obs, reward, terminated, truncated, info


class GameEpisodes(gym.vector.VectorWrapper):
    """Puts the whole-game statistics where the loop reads them (`info["episode"]`, `info["_episode"]`): with
    SAME_STEP autoreset a sub-environment's last-step info is filed under `info["final_info"]`. (A vector
    `RecordEpisodeStatistics` would count lives and clipped rewards.)"""

    def step(self, actions: Any) -> Any:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        final = info.get("final_info", {})
        if "episode" in final:
            info["episode"], info["_episode"] = final["episode"], final["_episode"]
        return obs, rewards, terminated, truncated, info


def _sign(reward: Any) -> float:
    return float(np.sign(reward))


def wrappers(frame_skip: int, training: bool) -> list[Any]:
    """The per-environment wrappers, innermost first (`gym.make_vec(wrappers=...)`): training adds whole-game
    statistics, an episode per life and sign-clipped rewards; evaluation plays whole games, raw scores."""
    w = gym.wrappers

    def preprocess(env: Any) -> Any:
        return w.AtariPreprocessing(env, noop_max=30, frame_skip=frame_skip, screen_size=84)

    def fire(env: Any) -> Any:
        meanings = env.unwrapped.get_action_meanings()
        return FireReset(env) if len(meanings) >= 3 and meanings[1] == "FIRE" else env

    def stack(env: Any) -> Any:
        return w.FrameStackObservation(env, FRAME_STACK)

    if training:
        return [
            preprocess,
            w.RecordEpisodeStatistics,
            EpisodicLife,
            fire,
            lambda env: w.TransformReward(env, _sign),
            stack,
        ]
    return [preprocess, EpisodicLife, fire, stack, WholeGame]

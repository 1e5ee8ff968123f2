"""Reward functions that recipes in the tests import by dotted path (`tests.rewards_for_tests:...`)."""

from __future__ import annotations

import os
import signal
import time

from hone.types import Rollout, Sample


def fails_on_odd_length(rollout: Rollout, sample: Sample) -> float:
    if rollout.response_len % 2:
        raise RuntimeError("verifier crashed")
    return 1.0


def fails_on_half_the_prompts(rollout: Rollout, sample: Sample) -> float:
    """Raises for about half the prompts (by their text), `token_id_reward` for the rest: a reward that
    fails on some responses, never on all (one raising on every response stops a run at its step-0 eval)."""
    if sum(map(ord, sample.prompt or "")) % 2:
        raise RuntimeError("verifier crashed")
    return token_id_reward(rollout, sample)


def always_raises(rollout: Rollout, sample: Sample) -> float:
    """A reward with a bug: it raises on every response."""
    return rollout.no_such_field  # type: ignore[attr-defined,no-any-return]


def token_id_reward(rollout: Rollout, sample: Sample) -> float:
    """Varies within almost every group of a random model, so every step has a gradient."""
    return float(sum(rollout.response_ids) % 7)


def slow_token_id_reward(rollout: Rollout, sample: Sample) -> float:
    """`token_id_reward` after 0.2 s: a producer that is busy scoring when a run is interrupted."""
    time.sleep(0.2)
    return token_id_reward(rollout, sample)


def half_uniform_reward(rollout: Rollout, sample: Sample) -> float:
    """0 for every response to about half the prompts (by their text), so those groups have uniform
    rewards; `token_id_reward` for the rest."""
    if sum(map(ord, sample.prompt or "")) % 2 == 0:
        return 0.0
    return token_id_reward(rollout, sample)


def slow_half_uniform_reward(rollout: Rollout, sample: Sample) -> float:
    """`half_uniform_reward` after 0.2 s (for the kill-and-resume helper)."""
    time.sleep(0.2)
    return half_uniform_reward(rollout, sample)


def digit_share_reward(rollout: Rollout, sample: Sample) -> float:
    """The share of digits in the response: ~4% for a random tiny model, and GRPO raises it in a few steps."""
    text = rollout.response_text
    return sum(c.isdigit() for c in text) / max(1, len(text))


_calls = 0


def token_id_reward_dying_once(rollout: Rollout, sample: Sample) -> float:
    """`token_id_reward`; but the 20th call in a Ray actor whose process title names `$HONE_TEST_DIE_IN`
    (e.g. `ray::RewardActor`) kills its own process (SIGKILL, mid-call), once per run: the first to die
    creates the file `$HONE_TEST_DIE_MARKER` (atomically), and its restarted incarnation lives."""
    global _calls
    _calls += 1
    role, marker = os.environ.get("HONE_TEST_DIE_IN"), os.environ.get("HONE_TEST_DIE_MARKER")
    if role and marker and _calls == 20:
        with open("/proc/self/cmdline", "rb") as f:
            title = f.read().decode(errors="replace")
        if role in title:
            try:  # created atomically: of two actors reaching their 20th call together, one dies
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return token_id_reward(rollout, sample)
            os.kill(os.getpid(), signal.SIGKILL)
    return token_id_reward(rollout, sample)


def token_id_reward_recorded(rollout: Rollout, sample: Sample) -> float:
    """`token_id_reward`, appending '<pid> <sample id>' to the file `$HONE_TEST_REWARD_LOG`: which
    process scored which prompt, in order."""
    with open(os.environ["HONE_TEST_REWARD_LOG"], "a") as f:
        f.write(f"{os.getpid()} {rollout.sample_id}\n")
    return token_id_reward(rollout, sample)


def prompt_class_reward(rollout: Rollout, sample: Sample) -> float:
    """By the prompt's index (the last number of its id) mod 3: always right (0), always wrong (1), or right
    for about half its responses (2: the parity of their token ids): easy, hard and intermediate prompts."""
    kind = int(sample.id.rsplit("-", 1)[1]) % 3
    return 1.0 if kind == 0 else 0.0 if kind == 1 else float(sum(rollout.response_ids) % 2)

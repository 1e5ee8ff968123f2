"""Multi-turn rollouts from synchronous code, and the scripted conversations SFT lays out the same way.

The episode itself is `hone.rollout.episodes.env_episode` (its rules are documented there): one
`Environment` per trajectory, every live episode's turn sampled in one batch, environments stepping
concurrently on one event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers import PreTrainedTokenizerBase

from hone.envs import Environment, Message
from hone.rollout.base import Sampler
from hone.rollout.episodes import ENV_ERRORS, EpisodeLimits, Episodes, play_sync
from hone.rollout.trajectory import ObservationRenderer, render_prompt
from hone.types import Rollout, Sample, SamplingParams

__all__ = ["ENV_ERRORS", "EpisodeLimits", "Episodes", "demonstration_tokens", "run_episodes"]


def run_episodes(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    make_env: Callable[[], Environment],
    samples: Sequence[Sample],
    params: SamplingParams,
    limits: EpisodeLimits,
) -> list[Rollout]:
    """`params.n` trajectories per sample (group id = the sample's index), in sample order."""
    return play_sync(sampler, tokenizer, Episodes(make_env, limits), samples, params)[0]


def demonstration_tokens(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict] | None = None,
    eos_ids: frozenset[int] | None = None,
) -> tuple[list[int], list[int]]:
    """A scripted conversation laid out exactly as `run_episodes` lays out a sampled one: token ids and
    a 0/1 train mask (1 on assistant tokens and their eos, 0 on the prompt and observations), for SFT.

    Each assistant turn ends with the tokenizer's eos, which must be one of `eos_ids`, the ids the
    sampler stops on (`Sampler.eos_token_ids`; default: that eos alone): SFT must not teach a turn end
    the episodes would not read as one. Observations follow as after a sampled eos.

    An assistant message with `"weight": 0` (OpenAI's chat fine-tuning convention) stays in the context
    but is not trained on: e.g. a wrong first try that shows the model how to recover, not how to err.
    """
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None or first == 0:
        raise ValueError("a demonstration needs initial messages followed by at least one assistant turn")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("multi-turn SFT needs a tokenizer with an eos token (it ends every assistant turn)")
    eos_ids = frozenset([eos]) if eos_ids is None else eos_ids
    if eos not in eos_ids:
        raise ValueError(
            f"multi-turn SFT ends turns with the tokenizer's eos {tokenizer.eos_token!r} (id {eos}), but "
            f"generation stops on ids {sorted(eos_ids)} only (generation_config.eos_token_id): add it there"
        )
    ids = render_prompt(tokenizer, messages[:first], tools)
    mask = [0] * len(ids)
    render = ObservationRenderer(tokenizer, eos_ids)
    observation: list[Message] = []
    for message in messages[first:]:
        if message["role"] != "assistant":
            observation.append(message)
            continue
        if observation:
            obs_ids = render(observation, ended_with_eos=True, tools=tools)
            ids, mask, observation = ids + obs_ids, mask + [0] * len(obs_ids), []
        weight = message.get("weight", 1)
        if weight not in (0, 1):
            raise ValueError(f"an assistant message's weight must be 0 or 1, got {weight!r}")
        turn = [*tokenizer.encode(message["content"], add_special_tokens=False), eos]
        ids, mask = ids + turn, mask + [int(weight)] * len(turn)
    return ids, mask

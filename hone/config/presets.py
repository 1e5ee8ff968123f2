"""Algorithm presets (`algorithm.preset`): every key a paper changes, set in one line.

`algorithm.advantage: dr_grpo` alone is half of Dr. GRPO (its advantage, not its loss normaliser); the
`dr_grpo` preset sets both. A preset fills only the keys the recipe and the overrides leave unset, so an
explicit key always wins; `apply_preset` returns what it set, so the run can say so.

What a preset sets: the objective and the shape of its update — advantage estimator, policy loss, clip
range, loss aggregation, KL term, filters, and the number of optimizer steps per batch where the paper
fixes it (that decides how off-policy the later mini-batches are, and so whether a clip range does
anything). What it leaves to the recipe: the scale — learning rate, group size, lengths, batch sizes —
which follows the model and the task more than the paper (docs/algorithms/presets.md lists the papers'
values), and rewards (`reward.*`: DAPO's soft overlong punishment is a reward component).

Leaf module: no import from hone at module level (the schema imports `PRESETS` to check the name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# A preset may set keys under these sections only (tests/test_presets.py checks it).
PRESET_SECTIONS = ("algorithm", "trainer", "rollout")


@dataclass(frozen=True)
class Preset:
    paper: str  # authors, year, title, arXiv id
    summary: str  # one line
    keys: dict[str, Any]  # dotted key -> value
    notes: str = ""  # what the paper needs that the preset leaves to the recipe, and any departure


PRESETS: dict[str, Preset] = {
    "grpo": Preset(
        paper="Shao et al. 2024, DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language "
        "Models, arXiv:2402.03300",
        summary="group-normalised advantage (r - mean) / std, PPO clip, k3 KL to the reference in the loss "
        "(beta 0.04), each response's token mean averaged over responses, one update per batch",
        keys={
            "algorithm.advantage": "grpo",
            "algorithm.norm_by_std": True,
            "algorithm.policy_loss": "ppo",
            "algorithm.loss_agg": "seq-mean-token-mean",
            "algorithm.kl.coef": 0.04,
            "algorithm.kl.estimator": "k3",
            "algorithm.kl.placement": "loss",
            # §4.2: "The policy model only has a single update following each exploration stage."
            "trainer.ppo_epochs": 1,
            "trainer.mini_batches": 1,
        },
        notes="paper scale, not set: lr 1e-6, 64 samples per question, max length 1024, batch 1024. "
        "The clip range is the loss's own (0.2 both sides); the paper gives no value.",
    ),
    "dr_grpo": Preset(
        paper="Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective, "
        "arXiv:2503.20783",
        summary="GRPO without its two biases: advantage r - mean (no std division) and the loss summed over "
        "tokens and divided by a constant (the generation budget), not by each response's length; no KL",
        keys={
            "algorithm.advantage": "dr_grpo",
            # Also set, so that a recipe that names `advantage: grpo` explicitly still gets no std division.
            "algorithm.norm_by_std": False,
            "algorithm.policy_loss": "ppo",
            # masked sum / (responses x norm_len); the trainer passes norm_len = rollout.max_new_tokens
            # (multi-turn: the most loss tokens a trajectory can have), TRL's max_completion_length.
            "algorithm.loss_agg": "seq-mean-token-sum-norm",
            "algorithm.kl.coef": 0.0,
        },
        notes="paper scale, not set: 8 samples per question, generation budget 3000 tokens (it is also "
        "the loss's constant normaliser here).",
    ),
    "dapo": Preset(
        paper="Yu et al. 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale, "
        "arXiv:2503.14476",
        summary="clip-higher (0.2 / 0.28), dynamic sampling (refill groups whose rewards differ), "
        "token-level loss, overlong filtering, no KL, 16 optimizer steps per batch",
        keys={
            "algorithm.advantage": "grpo",
            "algorithm.norm_by_std": True,
            "algorithm.policy_loss": "ppo",
            "algorithm.clip_low": 0.2,
            "algorithm.clip_high": 0.28,
            "algorithm.loss_agg": "token-mean",
            "algorithm.kl.coef": 0.0,
            "algorithm.dynamic_sampling.enabled": True,
            "algorithm.mask_truncated": True,
            # §4.1: 512 prompts x 16 responses per step, mini-batches of 512 responses: 16 gradient updates
            # per rollout step (the released verl recipe: mini-batches of 32 prompts x 16 responses).
            "trainer.ppo_epochs": 1,
            "trainer.mini_batches": 16,
        },
        notes="add the soft overlong punishment yourself, a reward component (presets set no reward "
        "keys): reward.components.overlong: {fn: overlong, args: {max_len: <rollout.max_new_tokens>, "
        "buffer: <a quarter of it; the paper 4096 of 20480>}}. Paper scale, not set: lr 1e-6, 16 samples "
        "per prompt, 512 prompts per step, max length 20480.",
    ),
    "gspo": Preset(
        paper="Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071",
        summary="sequence-level importance ratio (length-normalised), clipped at 3e-4 / 4e-4, sequence-mean "
        "loss, group-normalised advantage, no KL, each batch split into 4 mini-batches",
        keys={
            "algorithm.advantage": "grpo",
            "algorithm.norm_by_std": True,
            "algorithm.policy_loss": "gspo",
            "algorithm.clip_low": 3e-4,
            "algorithm.clip_high": 4e-4,
            "algorithm.loss_agg": "seq-mean-token-mean",
            "algorithm.kl.coef": 0.0,
            # §5.1 (v2): each batch of rollouts is partitioned into four mini-batches for gradient updates.
            "trainer.ppo_epochs": 1,
            "trainer.mini_batches": 4,
        },
        notes="Hone's gspo loss is the paper's GSPO-token form, equal in value and gradient to GSPO when "
        "every token of a response has the same advantage (as grpo's do).",
    ),
    "rloo": Preset(
        paper="Ahmadian et al. 2024, Back to Basics: Revisiting REINFORCE Style Optimization for Learning "
        "from Human Feedback in LLMs, arXiv:2402.14740",
        summary="REINFORCE with the leave-one-out baseline over the whole response (one action: its "
        "token log-probs summed), KL to the reference as a sequence-level penalty in the reward, on-policy",
        keys={
            "algorithm.advantage": "rloo",
            "algorithm.policy_loss": "ppo",  # at ratio 1 (one update per batch) PPO is REINFORCE
            "algorithm.loss_agg": "seq-mean-token-sum",
            "algorithm.kl.estimator": "k1",  # summed over the response: log pi(y|x) - log pi_ref(y|x)
            "algorithm.kl.placement": "reward",
            "trainer.ppo_epochs": 1,
            "trainer.mini_batches": 1,
        },
        notes="set algorithm.kl.coef (beta) yourself: the paper tunes it per task, and without it the "
        "KL penalty is off.",
    ),
    "reinforce_pp": Preset(
        paper="Hu 2025, REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models, "
        "arXiv:2501.03262",
        summary="return-to-go of the reward minus a per-token k1 KL penalty, whitened over the whole batch "
        "(no critic, no group baseline), PPO clip",
        keys={
            "algorithm.advantage": "reinforce_pp",
            "algorithm.policy_loss": "ppo",
            "algorithm.kl.estimator": "k1",
            "algorithm.kl.placement": "reward",
        },
        notes="set algorithm.kl.coef (beta) yourself: the paper does not pin it (OpenRLHF, its reference "
        "implementation, defaults to --init_kl_coef 0.01), and without it the KL penalty is off.",
    ),
}


def _format(value: Any) -> str:
    """A value as an override would spell it (YAML): true, 0.04, dr_grpo."""
    return value if isinstance(value, str) else json.dumps(value)


def _known() -> str:
    return ", ".join(sorted(PRESETS))


def _lookup(tree: dict[str, Any], key: str) -> tuple[bool, Any]:
    """Whether dotted `key` is present in `tree` (null counts: it is set), and its value."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def preset_name(tree: dict[str, Any]) -> str | None:
    """The tree's `algorithm.preset`, checked: None when unset; ValueError for an unknown name (the loader
    reports it as a ConfigError; this module imports nothing of Hone, as the schema imports it)."""
    algorithm = tree.get("algorithm")
    name = algorithm.get("preset") if isinstance(algorithm, dict) else None
    if name is None:
        return None
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"algorithm.preset: unknown preset {name!r}; known presets: {_known()}")
    return name


def apply_preset(tree: dict[str, Any]) -> list[str]:
    """Fill in the keys of the tree's `algorithm.preset` that the tree does not set; return them as
    "key=value" strings, in the preset's order. A key present in the tree (even null) is left alone: the
    recipe or an override set it. A section that is present but not a mapping is left for validation to
    report. The tree keeps `algorithm.preset`. Unknown name: ValueError listing the known presets."""
    name = preset_name(tree)
    if name is None:
        return []
    applied: list[str] = []
    for key, value in PRESETS[name].keys.items():
        present, _ = _lookup(tree, key)
        if present:
            continue
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[leaf] = value
            applied.append(f"{key}={_format(value)}")
    return applied


def explicit_over_preset(tree: dict[str, Any]) -> list[str]:
    """After `apply_preset`: the preset's keys whose value in the tree is not the preset's, because the
    recipe or an override set them ("key=value (preset: value)"): what to warn about, e.g. the default
    recipe's `kl: {coef: 0.0}` under the grpo preset."""
    name = preset_name(tree)
    if name is None:
        return []
    differ = []
    for key, value in PRESETS[name].keys.items():
        present, current = _lookup(tree, key)
        if present and current != value:
            differ.append(f"{key}={_format(current)} (preset: {_format(value)})")
    return differ

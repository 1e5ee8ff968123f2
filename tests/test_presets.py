"""Algorithm presets (`hone/config/presets.py`) and peers' key spellings (`hone/config/aliases.py`)."""

from __future__ import annotations

import copy
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pydantic import BaseModel

from hone.algorithms import ADVANTAGE_ESTIMATORS, aggregate_loss, scores_to_token_rewards
from hone.config import DEFAULT_RECIPE, ConfigError, HoneConfig, load_config, validate_recipe
from hone.config.aliases import PEER_KEYS
from hone.config.presets import PRESET_SECTIONS, PRESETS, apply_preset, explicit_over_preset
from hone.training.advantages import estimator_settings

# Keys other engineers add in issue 31; allowed to be missing from the schema until they land.
PENDING_KEYS = {"logging.samples", "algorithm.preset"}


def _validate(tree: dict[str, Any]) -> HoneConfig:
    """Validate a tree after `apply_preset`; `algorithm.preset` is popped in case the schema lacks it yet."""
    tree = copy.deepcopy(tree)
    tree.get("algorithm", {}).pop("preset", None)
    return validate_recipe(tree, "preset")


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _get(cfg: BaseModel, key: str) -> Any:
    value: Any = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds: X, X | None, dict[str, X]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, dict):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _schema_keys(model: type[BaseModel] = HoneConfig, prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        keys.add(key)
        for sub in _models_in(field.annotation):
            keys |= _schema_keys(sub, f"{key}.")
    return keys


def _default_tree() -> dict[str, Any]:
    tree = yaml.safe_load(DEFAULT_RECIPE.read_text())
    assert isinstance(tree, dict)
    return tree


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_sets_schema_keys_to_valid_values(name: str) -> None:
    preset = PRESETS[name]
    assert preset.paper and "arXiv:" in preset.paper and preset.summary and "\n" not in preset.summary
    for key in preset.keys:
        assert key.split(".")[0] in PRESET_SECTIONS, key
    tree = _nested(preset.keys)
    tree["algorithm"]["preset"] = name
    assert apply_preset(tree) == []  # every key already there
    cfg = _validate(tree)
    for key, value in preset.keys.items():
        assert _get(cfg, key) == value, key
    # The same from a bare tree (all defaults) and on top of the packaged default recipe.
    bare: dict[str, Any] = {"algorithm": {"preset": name}}
    apply_preset(bare)
    assert all(_get(_validate(bare), key) == value for key, value in preset.keys.items())
    default = _default_tree()
    default["algorithm"]["preset"] = name
    apply_preset(default)
    _validate(default)


def test_only_registered_algorithms_are_named() -> None:
    from hone.algorithms import AGGREGATION_MODES, KL_ESTIMATORS, POLICY_LOSSES

    for preset in PRESETS.values():
        keys = preset.keys
        assert keys["algorithm.advantage"] in ADVANTAGE_ESTIMATORS
        assert keys.get("algorithm.policy_loss", "ppo") in POLICY_LOSSES
        assert keys.get("algorithm.loss_agg", "token-mean") in AGGREGATION_MODES
        assert keys.get("algorithm.kl.estimator", "k3") in KL_ESTIMATORS


def test_apply_returns_exactly_the_keys_it_set_and_an_explicit_key_wins() -> None:
    tree: dict[str, Any] = {
        "algorithm": {"preset": "dapo", "clip_high": 0.3, "kl": {"coef": 0.01}},
        "trainer": {"lr": 1e-6},
    }
    applied = apply_preset(tree)
    expected = {
        k: v for k, v in PRESETS["dapo"].keys.items() if k not in {"algorithm.clip_high", "algorithm.kl.coef"}
    }
    assert [entry.split("=")[0] for entry in applied] == list(expected)
    assert "algorithm.dynamic_sampling.enabled=true" in applied
    assert "algorithm.clip_low=0.2" in applied and "algorithm.loss_agg=token-mean" in applied
    cfg = _validate(tree)
    assert cfg.algorithm.clip_high == 0.3 and cfg.algorithm.kl.coef == 0.01  # the recipe's, not the preset's
    assert cfg.algorithm.clip_low == 0.2 and cfg.algorithm.dynamic_sampling.enabled and cfg.trainer.lr == 1e-6
    assert tree["algorithm"]["preset"] == "dapo"  # left in the tree for the schema
    assert explicit_over_preset(tree) == [
        "algorithm.clip_high=0.3 (preset: 0.28)",
        "algorithm.kl.coef=0.01 (preset: 0.0)",
    ]
    assert apply_preset(tree) == []  # applying again sets nothing


def test_a_null_key_counts_as_set() -> None:
    # A saved config.yaml spells every key, null ones included: a preset then changes nothing in it.
    tree: dict[str, Any] = {"algorithm": {"preset": "dr_grpo", "loss_agg": None}}
    applied = apply_preset(tree)
    assert not any(entry.startswith("algorithm.loss_agg=") for entry in applied)
    assert _validate(tree).algorithm.loss_agg is None


def test_no_preset_changes_nothing() -> None:
    tree = _default_tree()
    before = copy.deepcopy(tree)
    assert apply_preset(tree) == [] and tree == before
    assert apply_preset({}) == [] and apply_preset({"algorithm": {"preset": None}}) == []


@pytest.mark.parametrize("name", ["drgrpo", 5, "GRPO"])
def test_unknown_preset_is_one_line_naming_the_known_ones(name: object) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"algorithm.preset={name}"])
    message = str(error.value)
    assert "\n" not in message and "+ overrides: algorithm.preset: unknown preset" in message
    assert "known presets: " + ", ".join(sorted(PRESETS)) in message


def test_dr_grpo_sets_both_halves_even_over_a_recipe_that_names_grpo() -> None:
    keys = PRESETS["dr_grpo"].keys
    assert keys["algorithm.advantage"] == "dr_grpo"
    assert keys["algorithm.loss_agg"] == "seq-mean-token-sum-norm"  # the constant normaliser
    # The packaged default recipe says `advantage: grpo` explicitly; that wins, and norm_by_std: false
    # still removes the std division, so the run is Dr. GRPO on both halves.
    tree = _default_tree()
    tree["algorithm"]["preset"] = "dr_grpo"
    applied = apply_preset(tree)
    assert "algorithm.norm_by_std=false" in applied
    assert "algorithm.loss_agg=seq-mean-token-sum-norm" in applied
    assert "algorithm.advantage=dr_grpo" not in applied
    cfg = _validate(tree)
    assert cfg.algorithm.advantage == "grpo" and cfg.algorithm.norm_by_std is False
    assert explicit_over_preset(tree) == ["algorithm.advantage=grpo (preset: dr_grpo)"]
    assert _advantages(cfg, [1.0, 0.0, 0.0, 1.0]) == pytest.approx([0.5, -0.5, -0.5, 0.5])


def _advantages(cfg: HoneConfig, rewards: list[float]) -> list[float]:
    """One group's advantages by the config's estimator, its hyperparameters filled as the learner does."""
    mask = torch.ones(len(rewards), 3)
    algo = cfg.algorithm
    adv, _ = ADVANTAGE_ESTIMATORS[algo.advantage](
        token_rewards=scores_to_token_rewards(torch.tensor(rewards), mask),
        response_mask=mask,
        group_ids=torch.zeros(len(rewards), dtype=torch.long),
        **estimator_settings(algo),
    )
    assert torch.equal(adv, adv[:, :1].expand_as(adv))  # one advantage per response, on every token
    return adv[:, 0].tolist()


def test_hand_computed_advantages_of_grpo_and_dr_grpo() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0]  # mean 0.5; unbiased std sqrt((4 x 0.25) / 3) = 0.57735
    dr = _validate(_nested(PRESETS["dr_grpo"].keys))
    assert _advantages(dr, rewards) == pytest.approx([0.5, -0.5, -0.5, 0.5], abs=1e-7)
    grpo = _validate(_nested(PRESETS["grpo"].keys))
    expected = 0.5 / ((1 / 3) ** 0.5 + grpo.algorithm.eps)  # 0.8660239 with eps 1e-6
    assert expected == pytest.approx(0.866025, abs=1e-5)
    assert _advantages(grpo, rewards) == pytest.approx([expected, -expected, -expected, expected], rel=1e-6)


def test_dr_grpo_aggregation_divides_by_a_constant_not_by_length() -> None:
    # Two responses of 1 and 3 loss tokens, per-token loss 1, budget norm_len = 4:
    # seq-mean-token-sum-norm = (1 + 3) / (2 x 4) = 0.5; GRPO's seq-mean-token-mean = (1 + 1) / 2 = 1.
    loss = torch.ones(2, 4)
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 0]])
    mode = PRESETS["dr_grpo"].keys["algorithm.loss_agg"]
    assert float(aggregate_loss(loss, mask, mode, norm_len=4)) == pytest.approx(0.5)
    assert float(aggregate_loss(loss, mask, PRESETS["grpo"].keys["algorithm.loss_agg"])) == pytest.approx(1.0)


def test_peer_keys_name_existing_hone_keys() -> None:
    known = _schema_keys()
    assert {"algorithm.kl.coef", "model.lora.r", "critic.value_clip", "reward.components"} <= known
    missing = {
        peer: key for peer, (key, _) in PEER_KEYS.items() if key not in known and key not in PENDING_KEYS
    }
    assert not missing
    for peer, (_, note) in PEER_KEYS.items():
        assert note and "\n" not in note, peer
        assert "." not in peer, peer  # a bare spelling, as typed after a section


def test_peer_keys_the_docs_promise() -> None:
    assert PEER_KEYS["num_generations"][0] == "rollout.n"
    assert PEER_KEYS["beta"][0] == "algorithm.kl.coef"
    assert PEER_KEYS["learning_rate"][0] == "trainer.lr"
    assert PEER_KEYS["epsilon_high"][0] == "algorithm.clip_high"
    assert PEER_KEYS["max_completion_length"][0] == "rollout.max_new_tokens"
    assert (
        PEER_KEYS["kl_loss_type"][0] == "algorithm.kl.estimator"
        and "low_var_kl" in PEER_KEYS["kl_loss_type"][1]
    )
    assert "COUNT" in PEER_KEYS["ppo_mini_batch_size"][1] and "SIZE" in PEER_KEYS["ppo_mini_batch_size"][1]
    assert PEER_KEYS["log_completions"][0] == "logging.samples"


DOCS = Path(__file__).parents[1] / "docs"
DOC_PAGES = sorted((DOCS / "algorithms").glob("*.md")) + sorted((DOCS / "coming-from").glob("*.md"))
_SECTIONS = "|".join(HoneConfig.model_fields)
_DOTTED = re.compile(rf"`((?:{_SECTIONS})\.[a-z_][a-z0-9_.]*)")
_FREE_FORM = ("reward.components.", "reward.args.", "data.task_args.", "data.args.")  # dicts of any keys
# verl's Hydra keys share section names with Hone's (`trainer.total_training_steps`): a dotted key with a
# peer's spelling in it is the peer's, quoted in a mapping table.
_PEER_WORDS = set(PEER_KEYS) | {"kl_ctrl", "optim", "lora_alpha", "logger", "nnodes", "n_gpus_per_node"}
_PEER_WORDS |= {"project_name", "experiment_name"}


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_docs_name_only_existing_keys(page: Path) -> None:
    known = _schema_keys() | PENDING_KEYS
    named = {key.rstrip(".") for key in _DOTTED.findall(page.read_text())}
    named = {k for k in named if not _PEER_WORDS & set(k.split("."))}
    unknown = sorted(k for k in named if k not in known and not k.startswith(_FREE_FORM))
    assert not unknown, f"{page.name} names keys the schema lacks: {unknown}"


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_docs_recipes_validate(page: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(), re.DOTALL)
    for block in blocks:
        if not re.search(r"^run:", block, re.MULTILINE):
            continue  # a fragment, not a whole recipe
        tree = yaml.safe_load(block)
        tree.get("logging", {}).pop("samples", None)  # PENDING_KEYS: lands with issue 31's logging change
        _validate(tree)

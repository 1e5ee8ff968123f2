"""Keys that moved, still read in their old spelling with one warning line naming the new one: one table for
every family. `load_config` moves a recipe's old spellings before validation (`move_legacy_keys`; a recipe
giving both spellings of one key is refused, since which one it means cannot be known) and sets an
override's where the key lives now (`moved_key`; it still wins over the recipe, as overrides do).

The placement keys left `trainer` for `cluster`, their reader (`hone.rl.placement`: how many producers,
sync or async, how stale a rollout may be, how long a publish may wait); a control recipe's keys moved into
`control:` and its subsections (`hone.config.control.legacy_key`)."""

from __future__ import annotations

from typing import Any

from hone.config.base import ConfigError
from hone.config.control import legacy_key, legacy_keys_in

# Read by the placement layer only: trainer.<key> -> cluster.<key>.
PLACEMENT_KEYS = (
    "mode",
    "max_staleness",
    "max_staleness_cap",
    "producers",
    "producer_split",
    "producer_retries",
    "publish_timeout_s",
)
MOVED_KEYS: dict[tuple[str, str], tuple[str, ...]] = {("trainer", k): ("cluster", k) for k in PLACEMENT_KEYS}


def moved_key(keys: list[str], control_algorithm: str | None, value: Any) -> list[str] | None:
    """Where a key once spelled `keys` (set to `value`) lives now; `[]` for a control key no longer read
    (dropped); None for a key that did not move. `control_algorithm` is a control recipe's
    `control.algorithm`, None for a language-model recipe."""
    new = MOVED_KEYS.get((keys[0], keys[1])) if len(keys) == 2 else None
    if new is not None:
        return list(new)
    return legacy_key(keys, control_algorithm, value) if control_algorithm is not None else None


def move_legacy_keys(tree: dict[str, Any]) -> list[str]:
    """Move a recipe's keys from where they once lived to where they live now (in `tree`, before
    validation; a recipe that gives both spellings of one key is refused); returns 'old -> new' for each
    key moved, for one deprecation line."""
    control = tree.get("control")
    algorithm = str(control.get("algorithm", "ppo")) if isinstance(control, dict) else None
    old_keys = [[s, k] for (s, k) in MOVED_KEYS if isinstance(tree.get(s), dict) and k in tree[s]]
    moved: list[str] = []
    for keys in old_keys + legacy_keys_in(tree):
        new = moved_key(keys, algorithm, tree[keys[0]][keys[1]])
        if new is None:
            continue
        value = tree[keys[0]].pop(keys[1])
        moved.append(note(keys, new, algorithm))
        if not new:
            continue
        node = tree
        for part in new[:-1]:
            node = node.setdefault(part, {})
        if new[-1] in node and node[new[-1]] != value:  # which one the user meant cannot be known
            where = ".".join(new)
            given = f"(to {value!r} and {node[new[-1]]!r})"
            raise ConfigError(f"{'.'.join(keys)} and {where} are both set {given}: keep {where}")
        node[new[-1]] = value
    return moved


def note(keys: list[str], new: list[str], algorithm: str | None) -> str:
    """'old -> new' (or why it was dropped), for the deprecation line."""
    if new:
        return f"{'.'.join(keys)} -> {'.'.join(new)}"
    return f"{'.'.join(keys)} (not read by control.algorithm {algorithm}: dropped)"

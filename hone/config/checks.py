"""Recipe checks that need what the config may not import: the registries of advantage estimators, policy
losses, engines and placements live above it (`hone.algorithms` imports torch), and the config is a leaf.

So the config asks them the other way round: a package above registers a check by its `pkg.mod:fn` path
(`register_recipe_check`, a string: nothing is imported then), and every recipe that becomes a `HoneConfig`
through `load_config` is handed to each registered check once it has been validated, before anything is
written. A check raises `ConfigError` with one line naming the key (`algorithm.advantage: unknown ...`);
`load_config` puts the recipe's name in front. `hone/__init__.py` registers the language-model checks
(`hone.rl.recipe_checks`), so they run whichever `hone.x` a program imports first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from hone.plugins import load_object

if TYPE_CHECKING:
    from hone.config.schema import HoneConfig

Family = Literal["language_model", "control"]
_CHECKS: dict[Family, list[str]] = {"language_model": [], "control": []}


def register_recipe_check(spec: str, family: Family = "language_model") -> None:
    """Run `fn(cfg)` (`spec` is `pkg.mod:fn`, imported when a recipe of `family` is first checked, so a
    control recipe never imports a language model's checks) on every loaded recipe of that family;
    registering the same path twice runs it once."""
    if spec not in _CHECKS[family]:
        _CHECKS[family].append(spec)


def recipe_checks(family: Family) -> tuple[str, ...]:
    """The paths of `family`'s registered checks, in the order they run."""
    return tuple(_CHECKS[family])


def run_recipe_checks(cfg: HoneConfig) -> None:
    """Every check registered for `cfg`'s family, in registration order; the first `ConfigError` ends it."""
    family: Family = "control" if cfg.control is not None else "language_model"
    for spec in _CHECKS[family]:
        load_object(spec, what=f"recipe check {spec!r}")(cfg)

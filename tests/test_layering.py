"""The package layering of docs/architecture.md ("Who may import whom"), checked on the source with `ast`.

`algorithms` <- `training` <- `run` <- {`rl`, `control`, `preference`} <- `cli`; `rewards` and `envs` <-
`rollout` <- `rl`; `data` and `models` feed both sides; `config` and `tracking` (metrics and plots) are leaves
everyone may use. `a <- b` means `b` may import `a`: `rewards` and `envs` are siblings, so neither imports
the other, and the families are siblings too: a control run loads no language-model code (`control` never
imports `rl`), and the language-model driver knows nothing of control. `preference` builds on `rl`.
Every import counts, also one inside a function: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

HONE = Path(__file__).resolve().parents[1] / "hone"

# `errors` (the `HoneError` base) and `plugins` (the `pkg.mod:attr` loader) serve every package: leaves.
LEAVES = frozenset(
    {
        "types",
        "aio",
        "seeding",
        "registry",
        "verifiers",
        "config",
        "tracking",
        "errors",
        "plugins",
        "version",
        "signals",
    }
)
_FEEDS = frozenset({"data", "models"})  # "feed both sides"
_BELOW_RUN = _FEEDS | {"algorithms", "training"}
_LM = _BELOW_RUN | {"rewards", "envs", "rollout", "run"}  # what the language-model families stand on
# What each package may import besides itself and the leaves.
ALLOWED: dict[str, frozenset[str]] = {
    **{leaf: frozenset() for leaf in LEAVES},
    "data": frozenset(),
    "models": frozenset(),
    "algorithms": _FEEDS,
    "training": _FEEDS | {"algorithms"},
    "rewards": _FEEDS,
    "envs": _FEEDS,
    "rollout": _FEEDS | {"rewards", "envs"},
    "run": frozenset({"training"}),  # what every family's run shares: seed, run directory, budget, signals
    "rl": _LM,  # language-model RL: the driver, placement and learner ranks
    "preference": _LM | {"rl"},  # hone pairs / dpo / rm
    "control": _BELOW_RUN | {"run"},  # gymnasium envs, policy networks and their loops; never rl
    "tinker": _LM,  # hone serve tinker: the Tinker API on the training, rollout and run parts
    "cli": _LM | {"rl", "preference", "control", "tinker"},
    "trl": _LM | {"rl", "preference", "control", "tinker", "cli"},  # TRL's GRPOTrainer on Hone: the top
    "__init__": _LM | {"rl", "preference", "control", "cli"},  # hone/__init__.py: the top, like cli
}
# Known departures, each with why it stays; `test_known_exceptions_are_still_needed` drops stale ones.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _module_package(path: Path, root: Path) -> list[str]:
    """The package a module's relative imports start from: `hone/envs/games.py` -> [hone, envs]."""
    return ["hone", *path.relative_to(root).with_suffix("").parts][:-1]


def _imported_packages(tree: ast.AST, package: list[str]) -> set[str]:
    """The `hone.X` packages a module imports (`from hone import X` counts as importing `X`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            prefix = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*prefix, *([node.module] if node.module else [])])
            names = [f"hone.{alias.name}" for alias in node.names] if base == "hone" else [base]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith("hone.")}
    return found


def layering_edges(root: Path = HONE) -> dict[tuple[str, str], list[str]]:
    """(importer package, imported package) -> the modules making that import, across packages."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        package = _module_package(path, root)
        importer = package[1] if len(package) > 1 else path.stem  # hone/seeding.py -> seeding
        tree = ast.parse(path.read_text(), filename=str(path))
        for imported in _imported_packages(tree, package):
            if imported != importer:
                edges.setdefault((importer, imported), []).append(f"hone/{path.relative_to(root).as_posix()}")
    return edges


def violations(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """One line per import the layering forbids, naming the modules that make it."""
    bad = []
    for (importer, imported), modules in sorted(edges.items()):
        if importer not in ALLOWED:
            bad.append(f"{importer}: a package the layering does not place; add it to ALLOWED ({modules})")
        elif imported not in ALLOWED[importer] | LEAVES and (importer, imported) not in KNOWN_EXCEPTIONS:
            bad.append(f"{importer} imports {imported}: {', '.join(modules)}")
    return bad


def test_packages_import_only_downward() -> None:
    assert violations(layering_edges()) == []


def test_known_exceptions_are_still_needed() -> None:
    edges = layering_edges()
    assert [pair for pair in KNOWN_EXCEPTIONS if pair not in edges] == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from hone.rewards.math import math_reward", ["envs imports rewards: hone/envs/games.py"]),
        ("def f():\n    from hone.training import Policy", ["envs imports training: hone/envs/games.py"]),
        ("import hone.rollout.base", ["envs imports rollout: hone/envs/games.py"]),
        ("from hone import rl", ["envs imports rl: hone/envs/games.py"]),
        ("from ..rewards import math", ["envs imports rewards: hone/envs/games.py"]),
        ("from hone.data import Arithmetic\nfrom hone.registry import Registry", []),
        ("from hone.envs.base import Environment\nfrom .tools import calculator\nfrom . import base", []),
    ],
)
def test_the_checker_flags_an_upward_or_sideways_import(
    tmp_path: Path, source: str, expected: list[str]
) -> None:
    (tmp_path / "hone" / "envs").mkdir(parents=True)
    (tmp_path / "hone" / "envs" / "games.py").write_text(source + "\n")
    assert violations(layering_edges(tmp_path / "hone")) == expected


def _run(code: str) -> str:
    """`code` in a fresh interpreter (nothing imported yet), from the repository root; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=HONE.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_config_and_a_control_recipe_load_no_torch() -> None:
    """The config is a leaf: importing it, and loading a control recipe (whose checks are its own), import
    neither torch nor the language-model registries."""
    heavy = "sorted(m for m in ('torch', 'hone.algorithms', 'hone.rollout', 'hone.rl') if m in sys.modules)"
    assert _run(f"import sys, hone.config; print({heavy})") == "[]"
    load = "from hone.config import load_config; load_config('cartpole-ppo')"
    assert _run(f"import sys; {load}; print({heavy})") == "[]"


def test_a_language_model_recipe_is_still_checked_against_the_registries() -> None:
    """The registry checks registered from above run in `load_config`: a bad advantage name is one line."""
    code = (
        "from hone.config import ConfigError, load_config\n"
        "try:\n    load_config(None, ['algorithm.advantage=nope'])\n"
        "except ConfigError as e:\n    print(e)"
    )
    message = _run(code)
    assert "\n" not in message
    assert re.search(
        r"\+ overrides: algorithm\.advantage: unknown advantage estimator 'nope'; registered: .*grpo", message
    )

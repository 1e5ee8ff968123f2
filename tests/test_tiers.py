"""The tests' tiers (tests/conftest.py): each test module has one, in one table; each test exactly one."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.conftest import TIER_NAMES, TIERS, tier_of

TESTS = Path(__file__).parent


def test_every_test_module_is_in_the_tier_table_and_every_entry_is_a_module() -> None:
    modules = {p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py")}
    assert sorted(modules - TIERS.keys()) == [], "add these to TIERS in tests/conftest.py"
    assert sorted(TIERS.keys() - modules) == [], "TIERS names modules that are gone"
    assert set(TIERS.values()) <= set(TIER_NAMES)
    assert list(TIERS) == sorted(TIERS)  # one place to look, in order


def test_a_test_has_its_own_tier_or_its_modules() -> None:
    assert tier_of("test_config.py", []) == TIERS["test_config.py"] == "unit"
    assert tier_of("test_vision.py", ["system"]) == "system"  # the one test that starts a subprocess


def test_a_module_without_a_tier_or_a_test_with_two_fails_collection_with_the_fix() -> None:
    with pytest.raises(pytest.UsageError, match=r"test_new\.py has no tier: add it to TIERS"):
        tier_of("test_new.py", [])
    with pytest.raises(pytest.UsageError, match=r"a test has tiers \['unit', 'system'\]"):
        tier_of("test_config.py", ["unit", "system"])


def test_the_tiers_are_registered_markers() -> None:
    ini = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.split(":")[0] for line in ini["markers"]}
    assert set(TIER_NAMES) <= registered
    # the default selection is as before the tiers: every tier, less slow, vllm and ray_cluster
    assert ini["addopts"].startswith("-m 'not slow and not vllm and not ray_cluster'")

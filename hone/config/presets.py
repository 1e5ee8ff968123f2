"""TEMPORARY stub (replaced by the presets module being written)."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, Any] = {"dr_grpo": None}


def apply_preset(tree: dict[str, Any]) -> list[str]:
    return []

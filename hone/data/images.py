"""Placeholder until the data branch lands (taken from it on merge)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image


def load_image(ref: Any, where: str = "") -> Image.Image:
    if isinstance(ref, Image.Image):
        return ref.convert("RGB")
    if isinstance(ref, dict):
        ref = ref.get("bytes") or ref.get("path")
    if isinstance(ref, bytes):
        return Image.open(io.BytesIO(ref)).convert("RGB")
    return Image.open(Path(ref)).convert("RGB")

"""Seeds derived from (run seed, stream, index), so each random stream of a run is reproducible on its own."""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, stream: str, index: int) -> int:
    """A 63-bit seed for draw `index` of the named `stream`: distinct streams never share seeds."""
    digest = hashlib.sha256(f"{seed}/{stream}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1

"""TEMPORARY stub (replaced by the peer-key table being written)."""

PEER_KEYS: dict[str, tuple[str, str]] = {"learning_rate": ("trainer.lr", "TRL's learning_rate")}

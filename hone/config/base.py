"""What every config section shares: the error a bad recipe raises, and the base class that forbids unknown
keys (a typo fails before any work starts, in one line naming the key)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from hone.errors import HoneError


class ConfigError(HoneError, ValueError):
    """A recipe or override that cannot be used; the message is one line naming the key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

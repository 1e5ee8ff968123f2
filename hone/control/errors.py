"""The one error a control run's set-up raises: one line naming the key, env or package."""

from __future__ import annotations

from hone.errors import HoneError


class ControlEnvError(HoneError, ValueError):
    """An environment that cannot be made or trained: one line naming `control.env`."""

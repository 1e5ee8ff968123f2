"""`HoneError`: the base of every error Hone reports to its user as one line.

The CLI catches this one type (not a list that each new error must join) and prints its message as
`hone: error: <line>`; anything else is a bug and keeps its traceback. Subclasses keep a standard base
too (`ValueError` for bad input, `RuntimeError` for a run that cannot go on) where callers and tests
catch them by it.
"""

from __future__ import annotations


class HoneError(Exception):
    """A user-facing failure; the message is one line that names the file, row, field or key at fault."""


class PluginError(HoneError, ValueError):
    """A `pkg.mod:attr` spec (a reward, environment, agent, scheduler...) that cannot be imported."""

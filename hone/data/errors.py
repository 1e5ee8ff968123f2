"""The one error type for bad input data, so callers can catch it apart from bugs."""

from hone.errors import HoneError


class HoneDataError(HoneError, ValueError):
    """Bad input data; the message names the file (or dataset), the row and the field at fault."""

"""Exceptions users see as one-line messages (the CLI prints them and exits non-zero)."""

from __future__ import annotations

from .config.schema import ConfigError

__all__ = ["ConfigError", "EnsioError", "InputError"]


class EnsioError(Exception):
    """Base of the errors ensio reports as a single line without a traceback."""


class InputError(EnsioError):
    """Bad input data: a missing, mismatched or corrupt file, a missing variable.

    The message names the file and, where it applies, the variable.
    """


"""The configuration error (its own module so every config module can raise it)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration problem; the message names the offending (dotted) key."""

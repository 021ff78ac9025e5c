"""The transfer room's user-facing error (one line, printed by ``ensio``)."""

from __future__ import annotations

from ..errors import EnsioError

__all__ = ["TransferError"]


class TransferError(EnsioError):
    """The interposer cannot be built, the socket directory is unsafe, the daemon does not
    start: one line saying what and where."""

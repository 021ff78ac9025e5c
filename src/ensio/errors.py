"""Exceptions users see as one-line messages (the CLI prints them and exits non-zero)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from .config.errors import ConfigError

__all__ = ["ConfigError", "EnsioError", "FileOpError", "InputError", "file_op",
           "os_error_message", "os_error_reason"]


class EnsioError(Exception):
    """Base of the errors ensio reports as a single line without a traceback."""


class InputError(EnsioError):
    """Bad input data: a missing, mismatched or corrupt file, a missing variable.

    The message names the file and, where it applies, the variable.
    """


class FileOpError(EnsioError):
    """An operating-system error on a file, as one line: ``cannot write /x/mean.nc: <reason>``."""


# str() of an OSError rebuilt from another MPI rank's note: "[Errno 28] No space ...: '/x'"
_REBUILT = re.compile(r"^\[Errno (\d+)\] (.*?)(?:: '(.*)')?(?: -> '(.*)')?$", re.S)


def _parts(exc: OSError) -> tuple[str, str | None]:
    reason, name = exc.strerror, exc.filename
    if reason is None:
        m = _REBUILT.match(str(exc))
        if m:
            reason, name = m.group(2), m.group(3) or name
        else:
            reason = str(exc) or type(exc).__name__
    return reason, name


def os_error_reason(exc: OSError) -> str:
    """The reason of ``exc`` without the file name ("No space left on device")."""
    return _parts(exc)[0]


def os_error_message(exc: OSError, op: str, path: str | os.PathLike | None = None) -> str:
    """``cannot <op> <file>: <reason>`` for ``exc`` (also one rebuilt from a string).

    ``path`` names the file when the error itself does not (a failed write
    through a descriptor).
    """
    reason, name = _parts(exc)
    name = name if name is not None else path
    return f"cannot {op} {os.fsdecode(name)}: {reason}" if name is not None else (
        f"cannot {op}: {reason}")


@contextmanager
def file_op(op: str, path: str | os.PathLike | None = None) -> Iterator[None]:
    """Turn an :class:`OSError` raised inside into a one-line :class:`FileOpError`."""
    try:
        yield
    except OSError as exc:
        raise FileOpError(os_error_message(exc, op, path)) from exc

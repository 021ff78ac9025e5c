"""The experiment's secret: who may stream files to a daemon over TCP.

The secret is a file of mode 0600 (``secret:`` in the transfer config, else
``<config file>.secret`` next to it), created by the first ``ensio run`` that needs it.
A secret file that group or others may read is refused: anyone who can read it can
feed files to the consumers.

The secret never crosses the network. Both ends prove they know it with HMAC-SHA256
over fresh random nonces of both sides (:func:`proof`), compared with
:func:`hmac.compare_digest`; the messages are in :mod:`.network`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from .errors import TransferError

__all__ = ["ensure_secret", "proof", "read_secret", "verify"]


def ensure_secret(path: str | os.PathLike) -> Path:
    """Create the secret file (0600, 32 random bytes, hex) unless it exists; check it.

    Creation is atomic (a complete temporary file linked to the name): of two hosts
    starting at once one creates it and both read the same secret.

    Raises
    ------
    TransferError
        It cannot be created, or :func:`read_secret` refuses it.
    """
    path = Path(path)
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        except OSError as exc:
            raise TransferError(f"transfer secret {path}: cannot create it "
                                f"({exc.strerror})") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
    read_secret(path)
    return path


def read_secret(path: str | os.PathLike) -> bytes:
    """The secret's bytes.

    Raises
    ------
    TransferError
        Missing, empty, not a regular file, not this user's, or readable by others.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise TransferError(f"transfer secret {path}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise TransferError(f"transfer secret {path}: not a regular file")
        if st.st_uid != os.getuid():
            raise TransferError(f"transfer secret {path}: owned by uid {st.st_uid}, "
                                f"not this user")
        if st.st_mode & 0o077:
            raise TransferError(f"transfer secret {path}: mode {stat.S_IMODE(st.st_mode):04o}, "
                                "must be 0600 (group and others must not read it)")
        data = f.read().strip()
    if len(data) < 16:
        raise TransferError(f"transfer secret {path}: shorter than 16 bytes")
    return data


def proof(secret: bytes, role: str, *parts: str) -> str:
    """HMAC-SHA256 (hex) of ``role`` and ``parts``: what one side sends to prove the secret."""
    msg = "\0".join(("ensio-transfer-1", role, *parts)).encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def verify(secret: bytes, got: str, role: str, *parts: str) -> bool:
    """Whether ``got`` is :func:`proof` of the same inputs (constant time)."""
    return hmac.compare_digest(got.encode(), proof(secret, role, *parts).encode())

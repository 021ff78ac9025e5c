"""The transfer config: components, connections, file patterns, budgets, fallbacks.

A transfer config is its own YAML file (``ensio run --transfer t.yaml``), not a
section of the ensemble config: the programs it chains (a model, CDO, NCO,
``ensio analyse``) are configured elsewhere, and a job script may run only the
programs of one component. It is resolved once into frozen dataclasses; every
problem is a :class:`~ensio.config.errors.ConfigError` naming the key
(``connections[1].to``), through the same converter as the ensemble config
(:func:`ensio.config.load.from_plain`), so unknown keys and wrong types read the
same everywhere.

The YAML key ``from`` is a Python keyword: it is the field ``source`` here, and
every message still says ``from``.

File patterns are absolute globs (relative ones are taken from the config file's
directory) with two wildcards, both inside one path component: ``*`` (any run of
characters) and ``{member}`` (a member number: one or more digits; ``{member:03d}``
exactly three). :class:`FilePattern` compiles them once, for Python (a regex) and
for the interposer (:meth:`FilePattern.encoded`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ..config.errors import ConfigError
from ..config.plain import from_plain
from ..config.yamlfile import read_yaml
from .hosts import HostDef, parse_hosts

__all__ = [
    "ConnectionDef",
    "FilePattern",
    "Pattern",
    "TransferConfig",
    "load_transfer_config",
    "transfer_from_dict",
]

Pattern = Literal["1-1", "1-N", "N-1", "all-to-all"]
Mode = Literal["sync", "async"]
Fallback = Literal["files", "error"]
Keep = Literal["until-consumed", "until-unlinked"]

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_MEMBER = re.compile(r"\{member(?::0?(\d+)d)?\}")

# The interposer's pattern bytes (csrc/ensio_interpose.h): control characters never
# appear in a configured path (they are refused below), so they need no escaping.
STAR, DIGITS, DIGIT = "\x01", "\x02", "\x03"


@dataclass(frozen=True)
class FilePattern:
    """One compiled file glob: the text as given (absolute) and its wildcard tokens.

    ``tokens`` alternates literal text and the markers ``STAR`` / ``DIGITS`` /
    ``DIGIT``; the same tokens drive :meth:`match` here and the C matcher.
    """

    text: str
    tokens: tuple[str, ...]

    @classmethod
    def parse(cls, text: str, key: str) -> FilePattern:
        """Compile ``text`` (already absolute); ConfigError naming ``key`` if it is not a glob
        of the supported form."""
        if any(ord(c) < 32 for c in text):
            raise ConfigError(f"{key}: {text!r} contains a control character")
        tokens: list[str] = []
        pos = 0
        for m in _MEMBER.finditer(text):
            tokens.extend(_stars(text[pos:m.start()], key, text))
            tokens.append(DIGIT * int(m.group(1)) if m.group(1) else DIGITS)
            pos = m.end()
        tokens.extend(_stars(text[pos:], key, text))
        return cls(text=text, tokens=tuple(t for t in tokens if t))

    def encoded(self) -> str:
        """The pattern as the interposer reads it (literal bytes and the three markers)."""
        return "".join(self.tokens)

    def literal_prefix(self) -> str:
        """The text before the first wildcard: the interposer's cheap first test."""
        enc = self.encoded()
        cut = min((enc.find(c) for c in (STAR, DIGITS, DIGIT) if c in enc), default=len(enc))
        return enc[:cut]

    def regex(self) -> re.Pattern[str]:
        """The same language as a Python regex (tests, ``ensio transfer status``)."""
        parts = []
        for t in self.tokens:
            if t == STAR:
                parts.append("[^/]*")
            elif t == DIGITS:
                parts.append("[0-9]+")
            elif t and set(t) == {DIGIT}:
                parts.append(f"[0-9]{{{len(t)}}}")
            else:
                parts.append(re.escape(t))
        return re.compile("".join(parts) + r"\Z")

    def match(self, path: str) -> bool:
        """Whether an absolute, normalized ``path`` is one of this pattern's files."""
        return self.regex().match(path) is not None

    def resolved(self) -> FilePattern:
        """The same pattern with symbolic links of its fixed directory resolved.

        The interposer canonicalizes relative paths against the physical working
        directory (``getcwd``), so ``/scratch`` being a link to ``/lus/scratch`` must
        be matched under both names.
        """
        prefix = self.literal_prefix()
        head = prefix.rsplit("/", 1)[0] or "/"
        real = os.path.realpath(head)
        if real == head:
            return self
        return FilePattern.parse(real.rstrip("/") + self.text[len(head):], "files")


def _stars(text: str, key: str, whole: str) -> list[str]:
    """Split literal text at ``*``; refuse the wildcards this glob language lacks."""
    for c in "?[]{}":
        if c in text:
            raise ConfigError(f"{key}: {whole!r}: {c!r} is not supported "
                              "(file patterns know only * and {member})")
    if "**" in text:
        raise ConfigError(f"{key}: {whole!r}: ** is not supported (* stays in one directory)")
    out: list[str] = []
    for i, part in enumerate(text.split("*")):
        if i:
            out.append(STAR)
        out.append(part)
    return out


@dataclass(frozen=True)
class ConnectionDef:
    """One connection: ``source`` (YAML ``from``) hands the files matching ``files`` to ``to``.

    Attributes
    ----------
    memory_mb : float or None
        The most memory the connection's files may hold on a host. None: the
        connection shares the host's default budget with every other connection
        without ``memory_mb`` (half the host's memory, or of the memory limit of the
        daemon's cgroup when lower: :func:`~.budget.default_budget_bytes`, computed by
        the daemon on the producer's host). Past it a producer's new file follows
        ``fallback``.
    keep : "until-consumed" or "until-unlinked"
        ``until-consumed``: a complete file is consumed once a process of every
        ``to`` component opened it and exited with status 0; a consumed file's memory
        is released when the budget needs it for a new file (before that file would
        spill), and ``ensio transfer stop`` does not write it (:mod:`.budget`). A
        later open of a released file sees the real path. ``until-unlinked``: held
        until unlinked, replaced or the daemon stops.
    fallback : "files" or "error"
        ``files``: the file goes to its real path (the budget is exceeded, or no
        daemon runs); ``error``: the producer's open fails with ENOSPC.
    persist : bool
        Also write each completed file to its real path (behind the producer's close).
    consumer_timeout_s : float
        How long a consumer's open waits for a file still being written before it
        fails (ETIMEDOUT) instead of hanging.
    serve_partial : bool
        On a consumer's host that receives the file from another host: once the
        file's final size is known (the producer closed it) but its bytes are still
        arriving, a consumer's open returns at once, and each read waits only for
        the bytes it asks for (:mod:`.progress`). Off: the open waits for the whole
        file. Before the producer's close the open waits either way (netCDF-4/HDF5
        files are not readable before ``nc_close``). ``consumer_timeout_s`` bounds
        only the open; a read waits while the stream progresses, and gets EIO if it
        breaks off.
    """

    name: str
    source: str
    to: tuple[str, ...]
    files: tuple[str, ...]
    pattern: Pattern = "1-1"
    mode: Mode = "sync"
    memory_mb: float | None = None
    fallback: Fallback = "files"
    keep: Keep = "until-consumed"
    persist: bool = False
    consumer_timeout_s: float = 600.0
    serve_partial: bool = False
    patterns: tuple[FilePattern, ...] = field(default=(), compare=False)

    @property
    def budget_bytes(self) -> int | None:
        """``memory_mb`` in bytes (MiB), None without a limit."""
        return None if self.memory_mb is None else int(self.memory_mb * 1024 * 1024)

    def matches(self, path: str) -> bool:
        """Whether the absolute, normalized ``path`` is one of this connection's files."""
        return any(p.match(path) for p in self.patterns)


@dataclass(frozen=True)
class TransferConfig:
    """The resolved transfer config.

    ``identity`` is a short hash of the file's path and content: the daemon keys each
    connection's memory budget by it, so two experiments sharing a host (and a
    daemon) with a connection of the same name do not share a budget.

    ``pool_mb`` (top-level key): the pre-faulted memory a daemon that ``ensio run``
    starts keeps ready for new files (:mod:`.pool`; None: the daemon's default, 0:
    none). It is the host's, not a connection's: it counts against no ``memory_mb``,
    and a daemon already running keeps the pool it was started with.
    """

    components: tuple[str, ...]
    connections: tuple[ConnectionDef, ...]
    source: Path | None = None
    identity: str = ""
    hosts: tuple[HostDef, ...] = ()
    secret: Path | None = None
    pool_mb: float | None = None

    def host(self, name: str) -> HostDef | None:
        """The host called ``name`` in ``hosts`` (None if it is not listed)."""
        return next((h for h in self.hosts if h.name == name), None)

    def connection(self, name: str) -> ConnectionDef:
        """The connection called ``name`` (KeyError if there is none)."""
        for c in self.connections:
            if c.name == name:
                return c
        raise KeyError(name)

    def for_path(self, path: str) -> ConnectionDef | None:
        """The first connection (in config order) whose files include ``path``."""
        return next((c for c in self.connections if c.matches(path)), None)


def load_transfer_config(path: str | os.PathLike) -> TransferConfig:
    """Read and resolve a transfer config file (``yaml.safe_load``).

    Relative file patterns are taken from the file's directory.

    Raises
    ------
    ConfigError
        One line naming the file and the key.
    """
    path = Path(path)
    raw = read_yaml(path, "transfer config")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: top level must be a mapping (components, connections)")
    try:
        cfg = transfer_from_dict(raw, base_dir=path.resolve().parent)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    content = json.dumps(raw, sort_keys=True, default=str)  # what the file says, canonical
    digest = hashlib.sha256(f"{path.resolve()}\n{content}".encode()).hexdigest()[:12]
    secret = cfg.secret
    if cfg.hosts and secret is None:
        secret = path.resolve().parent / f"{path.name}.secret"
    return replace(cfg, source=path.resolve(), identity=digest, secret=secret)


def transfer_from_dict(raw: Mapping[str, Any], base_dir: str | os.PathLike = ".") -> TransferConfig:
    """Resolve plain data (parsed YAML) into a :class:`TransferConfig`.

    Checks beyond the types: names are unique and simple (they travel in the
    daemon's protocol), ``from``/``to`` name listed components, patterns compile,
    numbers are positive.
    """
    for k in raw:
        if k not in ("components", "connections", "hosts", "secret", "pool_mb"):
            raise ConfigError(f"{k}: unknown config key")
    for k in ("components", "connections"):
        if k not in raw:
            raise ConfigError(f"{k}: required config key is missing")
    components = from_plain(tuple[str, ...], raw["components"], "components")
    _unique_names(components, "components")
    if not components:
        raise ConfigError("components: list at least one component")
    conns_raw = raw["connections"]
    if not isinstance(conns_raw, list) or not conns_raw:
        raise ConfigError("connections: expected a non-empty list of connections")
    connections = tuple(_connection(c, f"connections[{i}]", components, Path(base_dir))
                        for i, c in enumerate(conns_raw))
    _unique_names([c.name for c in connections], "connections", suffix=".name")
    hosts = parse_hosts(raw["hosts"], components) if "hosts" in raw else ()
    secret = None
    if "secret" in raw:
        given = from_plain(str, raw["secret"], "secret")
        secret = Path(base_dir, os.path.expanduser(given)).resolve()
    pool_mb = None
    if "pool_mb" in raw:
        pool_mb = from_plain(float, raw["pool_mb"], "pool_mb")
        if not pool_mb >= 0:
            raise ConfigError(f"pool_mb: must be 0 or more (MiB), got {raw['pool_mb']!r}")
    return TransferConfig(components=components, connections=connections, hosts=hosts,
                          secret=secret, pool_mb=pool_mb)


def _unique_names(names: Any, key: str, suffix: str = "") -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        where = f"{key}[{i}]{suffix}"
        if not _NAME.match(n):
            raise ConfigError(f"{where}: {n!r} is not a simple name (letters, digits, _ . -)")
        if n in seen:
            raise ConfigError(f"{where}: {n!r} appears twice")
        seen.add(n)


def _connection(raw: Any, key: str, components: tuple[str, ...], base: Path) -> ConnectionDef:
    """One connection: keys converted by ``from_plain``, then the cross-checks."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{key}: expected a mapping, got {raw!r}")
    if "source" in raw or "patterns" in raw:
        bad = "source" if "source" in raw else "patterns"
        raise ConfigError(f"{key}.{bad}: unknown config key")
    data = {("source" if k == "from" else k): v for k, v in raw.items()}
    try:
        conn = from_plain(ConnectionDef, data, key, skip={"patterns"})
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(f"{key}.source", f"{key}.from")) from None
    if not _NAME.match(conn.name):
        raise ConfigError(f"{key}.name: {conn.name!r} is not a simple name "
                          "(letters, digits, _ . -)")
    known = ", ".join(components)
    if conn.source not in components:
        raise ConfigError(f"{key}.from: {conn.source!r} is not a component ({known})")
    if not conn.to:
        raise ConfigError(f"{key}.to: name at least one component")
    for i, t in enumerate(conn.to):
        if t not in components:
            where = f"{key}.to" if len(conn.to) == 1 else f"{key}.to[{i}]"
            raise ConfigError(f"{where}: {t!r} is not a component ({known})")
    if not conn.files:
        raise ConfigError(f"{key}.files: list at least one file pattern")
    if conn.memory_mb is not None and not conn.memory_mb > 0:
        raise ConfigError(f"{key}.memory_mb: must be positive, got {conn.memory_mb}")
    if not conn.consumer_timeout_s > 0:
        raise ConfigError(f"{key}.consumer_timeout_s: must be positive, "
                          f"got {conn.consumer_timeout_s}")
    files, patterns = [], []
    for i, f in enumerate(conn.files):
        absolute = os.path.normpath(os.path.join(base, os.path.expanduser(f)))
        if f.endswith("/") or absolute == "/":
            raise ConfigError(f"{key}.files[{i}]: {f!r} names a directory, not files")
        files.append(absolute)
        patterns.append(FilePattern.parse(absolute, f"{key}.files[{i}]"))
    return replace(conn, files=tuple(files), patterns=tuple(patterns))

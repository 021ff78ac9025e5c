"""``ensio run --transfer CONFIG --component NAME -- COMMAND ...``: start a program
under the interposer.

Three things happen before COMMAND replaces this process (``exec``, so its exit
status, signals and process id are its own): the interposer is built if the cache
has none (:mod:`.build`), the daemon is started if none answers (:mod:`.runtime`),
and the component's rules (which globs it produces, which it consumes, with each
connection's budget, fallback, persist and consumer timeout) are written to a rules
file the interposer reads at load time. COMMAND gets::

    LD_PRELOAD=<interposer>[ <previous LD_PRELOAD>]
    ENSIO_TRANSFER_RULES=<socket dir>/rules/<config id>-<component>.rules
    ENSIO_TRANSFER_SOCKET=<socket dir>/daemon.sock

Extension point: the cross-host modes (patterns between hosts, async) add lines to
the rules file and requests to the protocol; the single-host exchange stays as is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ..config.errors import ConfigError
from ..durable import atomic_write
from . import build, launch
from .config import ConnectionDef, FilePattern, TransferConfig, load_transfer_config
from .errors import TransferError
from .hosts import consumer_hosts, hosts_of, process_rank, this_host
from .protocol import Client, encode
from .runtime import ensure_daemon
from .secret import ensure_secret

__all__ = ["command_env", "exec_command", "prepare", "rules_text"]


def _role(conn: ConnectionDef, component: str) -> str | None:
    producer, consumer = conn.source == component, component in conn.to
    return {(True, True): "B", (True, False): "P", (False, True): "C"}.get((producer, consumer))


def rules_text(cfg: TransferConfig, component: str, rank: int = 0) -> str:
    """The interposer's rules for ``component`` (format: ``csrc/ensio_interpose_paths.c``).

    A connection the component neither produces nor consumes gives no rule: its files
    are plain files for this component. A connection it produces in ``async`` mode or
    to other hosts adds a ``route`` line: the mode, and the hosts that receive the
    files of producer process ``rank`` (by the connection's ``pattern``). A connection
    it consumes with ``serve_partial`` adds a ``partial`` line. A connection it
    produces adds a ``keep`` line (``keep`` and the ``to`` components), which only the
    daemon reads (:mod:`.budget`; the interposer skips lines it does not know).
    """
    lines = ["ensio-transfer-rules 1", f"component {component}"]
    routes = []
    partial = []
    keeps = []
    for conn in cfg.connections:
        role = _role(conn, component)
        if role is None:
            continue
        budget = -1 if conn.budget_bytes is None else conn.budget_bytes
        head = (f"rule {role} {budget} {conn.fallback} {int(conn.persist)} "
                f"{int(conn.consumer_timeout_s * 1000)} {cfg.identity or 'local'}:{conn.name}")
        seen = set()
        for pattern in conn.patterns:
            for variant in (pattern, pattern.resolved()):
                if variant.encoded() not in seen:
                    seen.add(variant.encoded())
                    lines.append(f"{head} {variant.encoded()}")
        if role in ("P", "B"):  # the daemon reads it at HELLO (budget.py): who consumes
            keeps.append(f"keep {cfg.identity or 'local'}:{conn.name} {conn.keep} "
                         f"{','.join(conn.to)}")
        if conn.serve_partial and role in ("C", "B"):
            partial.append(f"partial {cfg.identity or 'local'}:{conn.name}")
        producer = role in ("P", "B")
        targets = consumer_hosts(cfg.hosts, conn.pattern, conn.to, rank) if producer else ()
        if targets or (conn.mode == "async" and producer):
            mode = "A" if conn.mode == "async" else "S"
            routes.append(f"route {cfg.identity or 'local'}:{conn.name} {mode} "
                          f"{','.join(targets) or '-'}")
    return "\n".join(lines + keeps + routes + partial) + "\n"


def prepare(config: str | os.PathLike | TransferConfig, component: str,
            socket_dir: str | os.PathLike | None = None, idle_timeout: float = 600.0
            ) -> dict[str, str]:
    """Build, start and write what COMMAND needs; the environment variables to add.

    Raises
    ------
    ConfigError
        ``component`` is not one of the config's components.
    TransferError
        No compiler, an unsafe socket directory, a daemon that does not start.
    """
    checks = None if isinstance(config, TransferConfig) else _config_checks(config)
    cfg = config if isinstance(config, TransferConfig) else load_transfer_config(config)
    if component not in cfg.components:
        where = f"{cfg.source}: " if cfg.source else ""
        raise ConfigError(f"{where}--component {component!r} is not one of the components "
                          f"({', '.join(cfg.components)})")
    if checks is not None:  # before the build reads them: a later change shows
        checks += [launch.stat_line(str(build.csrc_dir() / n)) for n in build.SOURCES]
    lib = build.interposer()
    sock = ensure_daemon(socket_dir, idle_timeout=idle_timeout, pool_mb=cfg.pool_mb)
    socket_st = os.stat(sock)  # before NETWORK: a daemon restarted after it has another
    rules = Path(sock).parent / "rules" / f"{cfg.identity or 'local'}-{component}.rules"
    rules.parent.mkdir(mode=0o700, exist_ok=True)
    rank = process_rank()
    if cfg.hosts:
        register_network(cfg, Path(sock))
        if checks is not None:  # the daemon was given it: another secret must be sent again
            checks.append(launch.stat_line(str(cfg.secret)))
        rules = rules.with_name(f"{rules.stem}-{rank}.rules")
    _write_rules(rules, rules_text(cfg, component, rank))
    if checks is not None:
        checks += [launch.stat_line(str(lib)), launch.stat_line(str(rules)), *launch.env_lines()]
        checks += sorted({launch.link_line(_fixed_dir(p)) for c in cfg.connections
                          for p in c.patterns})
    env = command_env(lib, rules, Path(sock))
    if checks is not None:
        launch.write_record(str(Path(sock).parent), launch.record_key(os.fspath(config), component),
                            checks, str(lib), env, (socket_st.st_ino, socket_st.st_mtime_ns))
    return env


def _write_rules(path: Path, text: str) -> None:
    """Replace the rules file unless it already says ``text``: the launch records of other
    ranks (and hosts) check it by its inode and time, and must stay valid."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    atomic_write(path, text, fsync=False)


def _config_checks(config: str | os.PathLike) -> list[str] | None:
    """The launch record's check of the config file, taken before it is read (None: it
    cannot be stat'ed, and loading it reports why)."""
    try:
        return [launch.stat_line(os.path.realpath(config))]
    except OSError:
        return None


def _fixed_dir(pattern: FilePattern) -> str:
    """The directory before a pattern's first wildcard (what :meth:`FilePattern.resolved`
    resolves links of)."""
    return pattern.literal_prefix().rsplit("/", 1)[0] or "/"


def register_network(cfg: TransferConfig, sock: Path) -> None:
    """Tell the daemon this experiment's hosts, its own address, the secret, and the hosts
    each connection's producer is placed on (``producers=NAME:HOST:HOST,...``: a
    consumer there waits until every one of them has ended a round, :class:`.view.Runs`).

    Raises
    ------
    TransferError
        This host is not in ``hosts``, the secret is unsafe, or the daemon cannot listen.
    """
    host = this_host()
    me = cfg.host(host)
    if me is None:
        raise TransferError(f"{cfg.source}: this host {host!r} is not in hosts "
                            f"({', '.join(h.name for h in cfg.hosts)}): set ENSIO_TRANSFER_HOST")
    assert cfg.secret is not None
    secret = ensure_secret(cfg.secret)
    peers = ",".join(f"{h.name}={h.endpoint}" for h in cfg.hosts)
    ident = cfg.identity or "local"
    pull = ",".join(f"{ident}:{c.name}" for c in cfg.connections if c.pattern == "all-to-all")
    producers = ",".join(":".join([c.name, *hosts_of(cfg.hosts, c.source)])
                         for c in cfg.connections if hosts_of(cfg.hosts, c.source))
    with Client(sock) as c:
        reply = c.request(encode("NETWORK", identity=ident, host=host, listen=me.endpoint,
                                 secret=str(secret), peers=peers, pull=pull,
                                 producers=producers))
    if reply.verb != "OK":
        raise TransferError(f"staging daemon: {reply.get('why') or 'NETWORK refused'}")


def command_env(lib: Path, rules: Path, sock: Path) -> dict[str, str]:
    """The variables that put a program under the interposer."""
    return {"LD_PRELOAD": launch.preload_value(str(lib), os.environ.get("LD_PRELOAD", "")),
            "ENSIO_TRANSFER_RULES": str(rules),
            "ENSIO_TRANSFER_SOCKET": str(sock)}


def exec_command(argv: Sequence[str], extra_env: dict[str, str]) -> NoReturn:
    """Replace this process with ``argv`` (PATH searched) with ``extra_env`` added.

    Raises
    ------
    OSError
        The command cannot be executed (not found: FileNotFoundError).
    """
    env = dict(os.environ)
    env.update(extra_env)
    os.execvpe(argv[0], list(argv), env)

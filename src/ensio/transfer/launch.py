"""The hot path of ``ensio run --transfer``: exec COMMAND from a launch record.

Why (issue 28 item 2): a launch used to cost a Python start-up with the YAML loader,
``pathlib``, hashing the interposer's sources and asking the daemon (0.1-2 s on a
loaded machine), which dominated the exchange of small files. The full preparation
(:func:`.run.prepare`: read the config, build the interposer, start the daemon, write
the rules) depends only on a few files and variables, so its result is recorded: the
first launch of a (config, component, rank, host) in a daemon directory writes a
*launch record* there (``launch/<key>.rec``, written by :func:`write_record`), and
every later one only checks that record and execs COMMAND. This module is that check,
in the standard library's cheapest modules (``os``, ``zlib``, ``_socket``): the
``ensio`` command reaches it before importing argparse or the rest of ensio
(``cli/main.py``). ``csrc/ensio_launch.c`` (``ensio-launch``, :mod:`.launcher`) is the
same check in C, for job scripts that want no Python at all: keep the two in step (the
tests run every case through both).

A record holds what its environment was derived from, and the hot path execs only if
all of it is unchanged; anything else (a difference, a missing or unreadable record,
an option the short parser below does not know, a command that cannot be executed)
falls back to the full path, which reports errors as before and rewrites the record:

* ``stat`` lines: the config file (stat taken before it was read), the interposer's
  sources, the built library and the rules file: modification time (ns), size, inode;
* ``link`` lines: each pattern's fixed directory and where its symbolic links led
  (the rules hold both spellings);
* ``env`` lines: ``CC``, ``XDG_CACHE_HOME``, ``HOME`` (which compiler and cache
  built the library; a variable unset is recorded as unset);
* ``socket``: the daemon's socket (inode, mtime): a restarted daemon, which has lost a
  ``hosts`` config's network registration, takes the full path once;
* ``set`` lines: the library, the rules file and the socket COMMAND gets.

The socket directory must still be this user's with mode 0700, and the daemon must
accept a connection (a bare connect: the daemon's idle timer restarts, nothing is
logged). Not checked: a compiler replaced in place under the same ``CC``/``HOME``
(the library built by the old one keeps being used until the sources change).
"""

from __future__ import annotations

import os
import stat
import sys
import zlib

__all__ = ["RANK_VARS", "launch_recorded", "parse_run_args", "preload_value", "record_key",
           "record_path", "recorded_env", "socket_dir_path", "write_record"]

MAGIC = "ensio-launch\t1"
#: The variables that name a process's rank, first set wins (as :func:`.hosts.process_rank`).
RANK_VARS = ("ENSIO_TRANSFER_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
             "SLURM_PROCID")
#: The environment that chose the interposer library (compiler, cache).
ENV_CHECKED = ("CC", "XDG_CACHE_HOME", "HOME")
_UNSET = "\x00unset"  # an env line's value for a variable that was not set
_OPTIONS = ("--transfer", "--component", "--socket-dir")


def socket_dir_path(given: str | None = None) -> str:
    """The daemon's directory: ``given``, ``$ENSIO_TRANSFER_DIR``,
    ``$XDG_RUNTIME_DIR/ensio-transfer``, else ``/tmp/ensio-transfer-<uid>``."""
    if given is not None:
        return os.fspath(given)
    if os.environ.get("ENSIO_TRANSFER_DIR"):
        return os.environ["ENSIO_TRANSFER_DIR"]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "ensio-transfer")
    return f"/tmp/ensio-transfer-{os.getuid()}"


def _rank() -> int:
    for var in RANK_VARS:
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 0


def _host() -> str:
    return os.environ.get("ENSIO_TRANSFER_HOST") or os.uname().nodename.split(".")[0]


def record_key(config: str, component: str) -> str:
    """What a record is for: the config's real path, the component, this process's rank
    and host (the rules of a ``hosts`` config differ per rank)."""
    return f"{os.path.realpath(config)}\0{component}\0{_rank()}\0{_host()}"


def record_path(sock_dir: str, key: str) -> str:
    """``<sock_dir>/launch/<16 hex digits of key>.rec`` (the record repeats the key)."""
    data = key.encode("utf-8", "surrogateescape")
    return os.path.join(sock_dir, "launch",
                        f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}.rec")


def preload_value(lib: str, previous: str) -> str:
    """``LD_PRELOAD`` with ``lib`` first and any earlier ensio interposer dropped."""
    kept = " ".join(p for p in previous.replace(":", " ").split() if "ensio_interpose" not in p)
    return f"{lib} {kept}".strip()


def parse_run_args(argv: list[str]) -> tuple[str, str, str | None, list[str]] | None:
    """``--transfer T --component C [--socket-dir D] [--] COMMAND ...`` (after ``run``):
    (T, C, D, COMMAND), or None for anything else (argparse then parses and reports)."""
    values: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-"):
            break
        name, eq, value = arg.partition("=")
        if name not in _OPTIONS or name in values:
            return None
        if not eq:
            i += 1
            if i >= len(argv):
                return None
            value = argv[i]
        values[name] = value
        i += 1
    command = argv[i:]
    if not command or "--transfer" not in values or "--component" not in values:
        return None
    return values["--transfer"], values["--component"], values.get("--socket-dir"), command


def _stat_line(path: str) -> str:
    st = os.stat(path)
    return f"stat\t{path}\t{st.st_mtime_ns}\t{st.st_size}\t{st.st_ino}"


def _safe_dir(sock_dir: str) -> bool:
    try:
        st = os.lstat(sock_dir)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & 0o077)


def _daemon_answers(sock: str) -> bool:
    import _socket  # the C module: ``socket`` would import enum, selectors... (~10 ms)

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    try:
        s.settimeout(5.0)
        s.connect(sock)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _line_holds(fields: list[str]) -> bool:
    """One record line's condition, checked now."""
    kind = fields[0]
    if kind == "stat" and len(fields) == 5:
        try:
            return _stat_line(fields[1]) == "\t".join(fields)
        except OSError:
            return False
    if kind == "link" and len(fields) == 3:
        return os.path.realpath(fields[1]) == fields[2]
    if kind == "env" and len(fields) == 3:
        return os.environ.get(fields[1], _UNSET) == fields[2]
    return False


def recorded_env(config: str, component: str, socket_dir: str | None = None
                 ) -> dict[str, str] | None:
    """The variables COMMAND needs, from a record that still holds; None if it does not.

    Never raises for a missing, stale or foreign record: the full path decides then.
    """
    sock_dir = socket_dir_path(socket_dir)
    key = record_key(config, component)
    try:
        with open(record_path(sock_dir, key), encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().split("\n")
    except OSError:
        return None
    if lines[:2] != [MAGIC, f"key\t{key}"] or lines[-2:] != ["end", ""]:
        return None
    values: dict[str, str] = {}
    socket_id = None
    for line in lines[2:-2]:
        fields = line.split("\t")
        if fields[0] == "set" and len(fields) == 3:
            values[fields[1]] = fields[2]
        elif fields[0] == "socket" and len(fields) == 3:
            socket_id = fields[1:]
        elif not _line_holds(fields):
            return None
    lib = values.pop("LIB", None)
    sock = values.get("ENSIO_TRANSFER_SOCKET")
    if lib is None or sock is None or socket_id is None:
        return None
    if not _safe_dir(sock_dir):
        return None
    try:
        st = os.stat(sock)
    except OSError:
        return None
    if [str(st.st_ino), str(st.st_mtime_ns)] != socket_id or not _daemon_answers(sock):
        return None
    values["LD_PRELOAD"] = preload_value(lib, os.environ.get("LD_PRELOAD", ""))
    return values


def launch_recorded(argv: list[str]) -> None:
    """Exec COMMAND if ``argv`` (after ``run``) has a launch record that holds; else return.

    Returns also when COMMAND cannot be executed: the full path then reports it.
    """
    parsed = parse_run_args(argv)
    if parsed is None:
        return
    config, component, socket_dir, command = parsed
    env = recorded_env(config, component, socket_dir)
    if env is None:
        return
    full = dict(os.environ)
    full.update(env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, full)
    except OSError:
        return


def write_record(sock_dir: str, key: str, checks: list[str], lib: str, env: dict[str, str],
                 socket_id: tuple[int, int]) -> bool:
    """Write the launch record of ``key``: ``checks`` (``stat``/``link``/``env`` lines, made
    by :func:`stat_line`, :func:`link_line`, :func:`env_lines`), the interposer ``lib`` and
    every variable of ``env`` (COMMAND's, but ``LD_PRELOAD``: made again from ``lib`` and
    the launching environment). False when a value cannot be written in a record (a tab or
    newline in a path: no record, every launch takes the full path)."""
    from ..durable import atomic_write

    sets = [("LIB", lib), *((k, v) for k, v in sorted(env.items()) if k != "LD_PRELOAD")]
    body = [MAGIC, f"key\t{key}", *checks, *(f"set\t{k}\t{v}" for k, v in sets),
            f"socket\t{socket_id[0]}\t{socket_id[1]}", "end", ""]
    if any("\n" in line for line in body[:-1]) or any("\t" in k + v for k, v in sets):
        return False
    if any(len(line.split("\t")) not in (2, 3, 5) for line in body[1:-2]):
        return False
    path = record_path(sock_dir, key)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    atomic_write(path, "\n".join(body).encode("utf-8", "surrogateescape"), fsync=False)
    return True


def stat_line(path: str) -> str:
    """The ``stat`` check of ``path`` as it is now (OSError if it is absent)."""
    return _stat_line(os.fspath(path))


def link_line(directory: str) -> str:
    """The ``link`` check of ``directory``: where its symbolic links lead now."""
    return f"link\t{directory}\t{os.path.realpath(directory)}"


def env_lines() -> list[str]:
    """The ``env`` checks of the variables that chose the interposer library."""
    return [f"env\t{name}\t{os.environ.get(name, _UNSET)}" for name in ENV_CHECKED]

"""``ensio transfer daemon|stop|status|build``: the per-host staging daemon of ``ensio run``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_parser"]

_DIR_HELP = ("the daemon's directory (default: $ENSIO_TRANSFER_DIR, "
             "$XDG_RUNTIME_DIR/ensio-transfer or /tmp/ensio-transfer-UID)")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``transfer`` and its actions."""
    p = subparsers.add_parser(
        "transfer",
        help="the staging daemon of direct transfer (ensio run --transfer)",
        description="The per-host staging daemon that holds transferred files in memory.",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    d = sub.add_parser("daemon", help="run the daemon in the foreground",
                       description="Run the staging daemon in the foreground (ensio run starts "
                                   "one when none answers). Logs to DIR/daemon.log.")
    d.add_argument("--socket-dir", type=Path, metavar="DIR", help=_DIR_HELP)
    d.add_argument("--idle-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="exit after this long without clients and held files (default 600)")
    d.add_argument("--pool-mb", type=float, default=None, metavar="MIB",
                   help="pre-faulted memory kept ready for producers' new files, so that "
                        "their writes copy into existing pages (default 256; 0: none)")
    d.set_defaults(func=_daemon)
    s = sub.add_parser("stop", help="stop the daemon",
                       description="Stop the daemon. Complete files of fallback: files "
                                   "connections not yet on disk are written to their real "
                                   "paths; other held files are lost (the log names them).")
    s.add_argument("--socket-dir", type=Path, metavar="DIR", help=_DIR_HELP)
    s.set_defaults(func=_stop)
    st = sub.add_parser("status", help="list the files the daemon holds")
    st.add_argument("--socket-dir", type=Path, metavar="DIR", help=_DIR_HELP)
    st.add_argument("--json", action="store_true",
                    help="one JSON object per file, with every field (bytes sent to other "
                         "hosts: sent, of which after the producer's close: after_close)")
    st.set_defaults(func=_status)
    b = sub.add_parser("build", help="compile the interposer into the cache now",
                       description="Compile the LD_PRELOAD interposer (ensio run does it on "
                                   "first use) and print its path.")
    b.add_argument("--cc", metavar="PATH", help="C compiler (default: $CC, cc, gcc)")
    b.set_defaults(func=_build)


def _daemon(args: argparse.Namespace) -> int:
    from ..transfer.daemon import DEFAULT_POOL_MB, AlreadyRunning, serve
    from ..transfer.runtime import prepare_dir, socket_dir

    pool_mb = DEFAULT_POOL_MB if args.pool_mb is None else args.pool_mb
    if not pool_mb >= 0:
        print(f"ensio transfer daemon: --pool-mb: must be 0 or more, got {args.pool_mb}",
              file=sys.stderr)
        return 2
    try:
        serve(prepare_dir(socket_dir(args.socket_dir)), idle_timeout=args.idle_timeout,
              pool_mb=pool_mb)
    except AlreadyRunning as exc:
        print(f"ensio transfer daemon: {exc}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    from ..transfer.runtime import socket_dir, stop_daemon

    where = socket_dir(args.socket_dir)
    print(f"stopped the staging daemon in {where}" if stop_daemon(where)
          else f"no staging daemon runs in {where}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from ..transfer.runtime import daemon_status, socket_dir

    where = socket_dir(args.socket_dir)
    files = daemon_status(where)
    if files is None:
        print(f"no staging daemon runs in {where}")
        return 1
    if args.json:
        import dataclasses
        import json

        for f in files:
            print(json.dumps(dataclasses.asdict(f), sort_keys=True))
        return 0
    print(f"staging daemon in {where}: {len(files)} file(s)")
    if files:
        width = max(len(f.path) for f in files)
        print(f"{'path':<{width}}  {'bytes':>12}  {'state':<9} {'component':<12} "
              f"{'connection':<12} persist")
        for f in files:
            print(f"{f.path:<{width}}  {f.size:>12}  {f.state:<9} {f.component:<12} "
                  f"{f.connection:<12} {f.persist}")
    return 0


def _build(args: argparse.Namespace) -> int:
    from ..transfer.build import interposer

    print(interposer(cc=args.cc))
    return 0

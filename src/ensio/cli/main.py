"""The ``ensio`` command: thin argument parsing over the library.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``
(which sets ``func``) and ``run(args) -> int``. Errors ensio understands
(bad config, bad input files) are printed as one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import ConfigError, EnsioError

#: Subcommand modules, in the order ``ensio --help`` lists them.
COMMANDS = ("synth", "analyse", "cycle", "report", "worker", "bench", "recover")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ensio",
        description="High-throughput ensemble data assimilation.",
    )
    parser.add_argument("--version", action="version", version=f"ensio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f".{name}", __package__).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, EnsioError) as exc:
        print(f"ensio: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ensio: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

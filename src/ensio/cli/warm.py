"""``python -m ensio.cli.warm [--check]``: compile the analysis' numba kernels once.

Why: ``make venv`` runs it after installing, so numba's cache holds every kernel
before the first test, member job or timed benchmark calls one
(:mod:`ensio.analysis.warm` says what is compiled and where the cache lives).
Not an ``ensio`` sub-command: it belongs to installing, like ``pip install``.
``--check`` lists the cache files instead and exits 1 if there are none.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Compile (or load) the kernels, or with ``--check`` list the cache files."""
    from ..analysis.warm import cache_files, warm

    p = argparse.ArgumentParser(prog="python -m ensio.cli.warm",
                                description="Fill numba's cache of the analysis kernels.")
    p.add_argument("--check", action="store_true",
                   help="list the cache files instead of compiling (exit 1: none)")
    args = p.parse_args(argv)
    if args.check:
        files = cache_files()
        for f in files:
            print(f)
        return 0 if files else 1
    seconds = warm()
    print(f"ensio: numba kernels compiled or loaded in {seconds:.1f} s "
          f"({len(cache_files())} cache files)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

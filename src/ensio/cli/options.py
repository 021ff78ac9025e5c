"""Command-line options several sub-commands share, spelt once."""

from __future__ import annotations

import argparse

__all__ = ["add_set_option"]


def add_set_option(
    p: argparse.ArgumentParser, help: str = "override a config key (repeatable)"
) -> None:
    """``--set KEY=VALUE`` (repeatable) into ``args.overrides``; the value is parsed as YAML."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=help)

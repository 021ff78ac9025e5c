"""Command-line options several sub-commands share, spelt once."""

from __future__ import annotations

import argparse

__all__ = ["add_set_option", "positive_int_list"]


def add_set_option(
    p: argparse.ArgumentParser, help: str = "override a config key (repeatable)"
) -> None:
    """``--set KEY=VALUE`` (repeatable) into ``args.overrides``; the value is parsed as YAML."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=help)


def positive_int_list(what: str):
    """An argparse ``type`` for ``N[,N…]`` of integers ≥ 1; ``what`` names them in the error."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            out = tuple(int(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected N[,N…], got {text!r}") from None
        if not out or min(out) < 1:
            raise argparse.ArgumentTypeError(f"{what} must be >= 1, got {text!r}")
        return out

    return parse

"""Command-line options several sub-commands share, spelt once."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from ..config.errors import ConfigError

if TYPE_CHECKING:
    from ..config.schema import Config

__all__ = ["add_members_option", "add_set_option", "positive_int_list", "select_members"]


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


def member_list(text: str) -> tuple[int, ...]:
    """An argparse ``type``: comma-separated member numbers (``1,2,4``)."""
    try:
        ids = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated member numbers, got {text!r}"
        ) from None
    return ids


def add_members_option(p: argparse.ArgumentParser, help: str) -> None:
    """``--members LIST`` into ``args.members`` (None: every member); apply it with
    :func:`select_members`, so every command selects members the same way."""
    p.add_argument("--members", type=member_list, default=None, metavar="LIST", help=help)


def select_members(config: Config, members: tuple[int, ...] | None) -> Config:
    """``config`` with only ``members`` (``ensemble.ids`` and ``ensemble.size``); None: as is.

    A member the config does not allow is a :class:`ConfigError` naming ``--members``.
    """
    if members is None:
        return config
    try:
        ens = dataclasses.replace(config.ensemble, ids=members, size=len(members))
    except ConfigError as exc:
        raise ConfigError(f"--members: {exc}") from None
    return dataclasses.replace(config, ensemble=ens)

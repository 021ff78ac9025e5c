"""Roles of the stored axes of the state variables: names, halo, time level, grid file.

Real models' restarts (Veros, NEMO) store more than the state: ghost cells
around the interior (``ensemble.halo``), several time levels of which one is
the state (``ensemble.time_level``), and no names or coordinates for their
dimensions (``ensemble.dims``, ``ensemble.grid``). These keys say which stored
elements are state rows (:mod:`ensio.layout.view`) and how the others are kept
consistent after the analysis (``cyclic``, ``time_level.increment``,
``variables[].also``: :mod:`ensio.layout.companions`).

What can be checked without the files is checked here, each error naming its
key; the rest (a halo at least half of its axis, a dimension no file has) is
checked when the layout is built from the first member.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .errors import ConfigError

__all__ = ["Increment", "TimeLevel", "check_axes"]

#: Which time levels receive the analysis increment: only the state's, or all.
Increment = Literal["current", "all"]


@dataclass(frozen=True)
class TimeLevel:
    """``ensemble.time_level`` — a time-level axis of the state variables.

    Exactly one of ``index`` (the 0-based level that is the state) and
    ``from_`` (YAML key ``from``: a scalar integer variable of every member
    file that holds it, e.g. Veros's ``core/tau``; all members must agree)
    is given. ``increment``: ``current`` (default) writes the analysis into
    the state's level only; ``all`` adds the same increment to every other
    level.
    """

    dim: str
    index: int | None = None
    from_: str | None = field(default=None, metadata={"key": "from"})
    increment: Increment = "current"

    def __post_init__(self) -> None:
        if (self.index is None) == (self.from_ is None):
            both = "both" if self.index is not None else "neither"
            raise ConfigError(
                f"ensemble.time_level: give exactly one of index and from ({both} given)"
            )
        if self.index is not None and self.index < 0:
            raise ConfigError(f"ensemble.time_level.index: must be >= 0, got {self.index}")
        if not self.dim:
            raise ConfigError("ensemble.time_level.dim: empty dimension name")
        if self.from_ is not None and not self.from_:
            raise ConfigError("ensemble.time_level.from: empty variable name")


def _names(key: str, names: Sequence[str]) -> None:
    """A list of dimension names: non-empty, distinct."""
    for n in names:
        if not n:
            raise ConfigError(f"{key}: empty dimension name")
    dup = sorted({n for n in names if list(names).count(n) > 1})
    if dup:
        raise ConfigError(f"{key}: dimension {dup[0]!r} listed twice")


def check_axes(
    dims: tuple[str, ...] | None,
    var_dims: Iterable[tuple[str, tuple[str, ...] | None]],
    halo: Mapping[str, int],
    cyclic: Sequence[str],
    time_level: TimeLevel | None,
) -> None:
    """The ``ensemble`` axis keys, checked against each other (names the key).

    Parameters
    ----------
    dims : tuple of str or None
        ``ensemble.dims``.
    var_dims : iterable of (variable name, dims or None)
        ``ensemble.variables[i].dims``.
    halo, cyclic, time_level
        ``ensemble.halo``, ``ensemble.cyclic``, ``ensemble.time_level``.
    """
    if dims is not None:
        _names("ensemble.dims", dims)
    declared: list[tuple[str, ...]] = []
    every = True  # every variable's dims are known without the files
    for i, (_, vd) in enumerate(var_dims):
        if vd is not None:
            _names(f"ensemble.variables[{i}].dims", vd)
        own = vd if vd is not None else dims
        if own is None:
            every = False
        else:
            declared.append(own)
    known = {d for ds in declared for d in ds}
    for d, h in halo.items():
        if h < 0:
            raise ConfigError(f"ensemble.halo.{d}: must be >= 0, got {h}")
        if every and d not in known:
            raise ConfigError(
                f"ensemble.halo.{d}: {d!r} is not a dimension of any state variable "
                f"(declared: {', '.join(sorted(known))})"
            )
    _names("ensemble.cyclic", cyclic)
    for d in cyclic:
        if halo.get(d, 0) < 1:
            raise ConfigError(
                f"ensemble.cyclic: {d!r} has no halo (ensemble.halo.{d}): a cyclic axis's "
                "halo cells are the ones rewritten"
            )
    if time_level is None:
        return
    td = time_level.dim
    if halo.get(td, 0) > 0:
        raise ConfigError(
            f"ensemble.time_level.dim: {td!r} also has a halo (ensemble.halo.{td})"
        )
    if every and td not in known:
        raise ConfigError(
            f"ensemble.time_level.dim: {td!r} is not a dimension of any state variable "
            f"(declared: {', '.join(sorted(known))})"
        )

"""Mismatches between the config and the model (issue 27 item 3), as one-line messages.

Why a module: the server used to accept them silently — a configured domain
larger than the model's grid gave a file that was 99 % fill with NaN
coordinates, and a source field the model never sent gave all-fill outputs
with exit status 0. Both are the config disagreeing with the model, found
only by the servers once the model declared itself; these pure functions say
what disagrees and what it affects. (A field sent with the wrong size is
refused by the client, locally, and by the server's part check.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .config import DomainDef, FieldDef, IOServerConfig
from .configload import expression_refs
from .parts import Part

__all__ = ["extent_mismatch", "dependents", "unsent_warning"]


def extent_mismatch(d: DomainDef, parts: Sequence[Part]) -> str | None:
    """Why the ranks' parts do not make up domain ``d``, or None.

    The parts must reach the configured last column and row (``ni_glo``,
    ``nj_glo``): a model grid smaller than the config's is an error. Holes
    are allowed (a model may leave out land-only subdomains, as NEMO does:
    those points are masked), except in a rectilinear domain, whose 1-D
    ``lon``/``lat`` need every column and row of some part.
    """
    parts = [p for p in parts if p.size > 0]
    if not parts:
        return None  # no rank declared it: reported where a file needs it
    i_end = max(p.ibegin + p.ni for p in parts)
    j_end = max(p.jbegin + p.nj for p in parts)
    what = (f"domain {d.id!r}: the model ranks' parts reach i < {i_end}" + (
        f", j < {j_end}" if d.type != "unstructured" else "") + f" of the configured "
        f"ni_glo = {d.ni_glo}" + (f", nj_glo = {d.nj_glo}" if d.type != "unstructured" else "")
        + f" (ioserver.domains.{d.id}): the config does not match the model's grid")
    if i_end != d.ni_glo or (d.type != "unstructured" and j_end != d.nj_glo):
        return what
    if d.type == "rectilinear":
        cols, rows = [False] * d.ni_glo, [False] * d.nj_glo
        for p in parts:
            cols[p.ibegin:p.ibegin + p.ni] = [True] * p.ni
            rows[p.jbegin:p.jbegin + p.nj] = [True] * p.nj
        if not (all(cols) and all(rows)):
            i, j = (cols.index(False) if not all(cols) else None,
                    rows.index(False) if not all(rows) else None)
            where = f"column i = {i}" if i is not None else f"row j = {j}"
            return (f"domain {d.id!r}: no model rank's part covers {where} of the configured "
                    f"{d.ni_glo} x {d.nj_glo} (ioserver.domains.{d.id}; a rectilinear "
                    "domain needs every longitude and latitude): the config does not match "
                    "the model's grid")
    return None


def _reads(fd: FieldDef) -> set[str]:
    """Ids a field's data comes from directly (its reference and its expression's names)."""
    names: set[str] = set()
    if fd.field_ref is not None:
        names.add(fd.field_ref)
    if fd.expr is not None:
        now, at = expression_refs(fd.expr)
        names |= now | at
    return names


def dependents(cfg: IOServerConfig, source: str) -> list[str]:
    """The outputs (``file/variable``) whose data derive from field ``source``."""
    memo: dict[str, bool] = {}

    def derives(fid: str, stack: frozenset[str]) -> bool:
        if fid == source:
            return True
        if fid in memo or fid in stack or fid not in cfg.fields:
            return memo.get(fid, False)
        memo[fid] = any(derives(r, stack | {fid}) for r in _reads(cfg.fields[fid]))
        return memo[fid]

    return [f"{f.id}/{fd.name}" for f in cfg.enabled_files for fd in f.fields
            if fd.enabled and any(derives(r, frozenset()) for r in _reads(fd))]


def unsent_warning(cfg: IOServerConfig, fid: str) -> str:
    """The one-line warning about a source field the model never sent."""
    outs = dependents(cfg, fid)
    return (f"ensio ioserver: warning: field {fid!r} (ioserver.fields) was never sent by the "
            "model: every value of " + (", ".join(outs) if outs else "its outputs")
            + " is missing (fill)")


def never_sent(fields: Iterable[str], seen: set[str], periods: Mapping[str, Sequence[int]],
               last_step: int) -> list[str]:
    """Source fields the model should have sent by ``last_step`` and never did."""
    return sorted(f for f in fields if f not in seen
                  and any(p <= last_step for p in periods.get(f, ())))

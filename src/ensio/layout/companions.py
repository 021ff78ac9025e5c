"""Write-back companions: stored elements outside the state that follow its rows.

A model restart stores more than the state: ghost cells around the interior,
several time levels, sometimes a second copy of a field (NEMO's ``tb`` beside
``tn``). These elements are not rows of the state vector, yet after an
analysis the model expects them consistent with the rows, so the write-back
rewrites them from the rows' values, in the same transaction:

* ``copy`` — the element becomes a bit-exact copy of the analysis of a row
  (the halo of a cyclic axis: ``ensemble.cyclic``);
* ``increment`` — the element becomes its old value plus the row's increment,
  analysis − prior (the other time levels, ``time_level.increment: all``, and
  the ``also`` variables).

Either is written only where the row's stored value changed, so an analysis
that changes nothing leaves every byte as it was. A :class:`Companion` lists
target elements and the (variable-local) source row of each; the write path
(:mod:`ensio.io.modes.companionwrite`, :mod:`ensio.io.txn.librarycopy`) needs
nothing else. The builders are pure functions of a variable's shape, dims and
rows (its sorted ``active`` elements) and of the ``ensemble`` keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..errors import InputError
from .encoding import Encoding

if TYPE_CHECKING:
    from ..config.schema import EnsembleSection
    from .state import StateLayout, VariableLayout, VarMeta

__all__ = ["Companion", "attach_companions", "build_companions", "changed_bytes",
           "companion_sources", "cyclic_targets", "level_targets", "write_back"]

CompanionKind = Literal["copy", "increment"]


@dataclass(frozen=True, eq=False)
class Companion:
    """Elements of ``target`` rewritten from rows of the variable that holds this companion.

    Attributes
    ----------
    kind : {"copy", "increment"}
        ``copy``: target := the source row's analysis (its stored bytes);
        ``increment``: target := old target + (analysis − prior) of the row.
    target : str
        The variable written: the source variable itself (halo, other levels)
        or another of the same shape (``also``).
    target_elements : numpy.ndarray
        int64 (k,), flat (C order) element indices in ``target``, sorted,
        distinct, never a row of the state.
    source_rows : numpy.ndarray
        int64 (k,), the source variable's local rows (0 .. size - 1).
    """

    kind: CompanionKind
    target: str
    target_elements: np.ndarray
    source_rows: np.ndarray

    def __post_init__(self) -> None:
        if self.target_elements.shape != self.source_rows.shape:
            raise ValueError("companion: target_elements and source_rows differ in length")

    @property
    def size(self) -> int:
        return int(self.target_elements.size)


def _positions(shape: tuple[int, ...], active: np.ndarray | None, size: int) -> np.ndarray:
    """Flat element of each row, int64 (size,)."""
    if active is None:
        return np.arange(size, dtype=np.int64)
    return np.asarray(active, dtype=np.int64)


def cyclic_targets(
    shape: tuple[int, ...],
    elements: np.ndarray,
    axes: Mapping[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Halo cells of cyclic axes that copy the rows at ``elements``.

    For an axis of ``h`` halo cells on each side and ``n`` interior cells
    (stored length ``n + 2h``), halo index ``i < h`` copies interior ``i + n``
    and ``i >= n + h`` copies ``i - n``. With several cyclic axes a corner
    cell (halo in two axes) copies the interior cell shifted in both.

    Parameters
    ----------
    shape : tuple of int
        The stored shape.
    elements : numpy.ndarray
        int64 (r,), flat elements of the rows (all interior in ``axes``).
    axes : mapping of int to int
        Cyclic axis → its halo width h (> 0).

    Returns
    -------
    (targets, rows) : int64 arrays (k,)
        Each halo element and the index into ``elements`` of its source.
    """
    idx = np.unravel_index(elements, shape)
    # each entry: (rows, multi-index of the target, moved in some axis)
    entries = [(np.arange(elements.size, dtype=np.int64), list(idx), False)]
    for ax, h in axes.items():
        n = shape[ax] - 2 * h
        grown = []
        for rows, pos, moved in entries:
            grown.append((rows, pos, moved))
            j = pos[ax]
            for hit, shift in ((j >= n, -n), (j < 2 * h, n)):
                if hit.any():
                    moved_pos = [p[hit] for p in pos]
                    moved_pos[ax] = moved_pos[ax] + shift
                    grown.append((rows[hit], moved_pos, True))
        entries = grown
    picked = [(rows, pos) for rows, pos, moved in entries if moved]
    if not picked:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    targets = np.concatenate([np.ravel_multi_index(tuple(p), shape) for _, p in picked])
    rows = np.concatenate([r for r, _ in picked])
    return targets.astype(np.int64), rows


def level_targets(
    shape: tuple[int, ...], elements: np.ndarray, axis: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The same positions at every other index of ``axis`` (a time-level axis).

    ``elements``: int64 (r,), all at one level. Returns, per other level,
    ``(targets, indices into elements)``.
    """
    if elements.size == 0:
        return []
    pos = list(np.unravel_index(elements, shape))
    level = int(pos[axis][0])
    out = []
    every = np.arange(elements.size, dtype=np.int64)
    for lev in range(shape[axis]):
        if lev == level:
            continue
        pos[axis] = np.full(elements.size, lev, dtype=np.int64)
        out.append((np.ravel_multi_index(tuple(pos), shape).astype(np.int64), every))
    return out


def _companion(kind: CompanionKind, target: str, parts: Sequence[tuple[np.ndarray, np.ndarray]]
               ) -> Companion | None:
    """One companion from (targets, rows) parts, sorted by target element; None if empty."""
    parts = [p for p in parts if p[0].size]
    if not parts:
        return None
    targets = np.concatenate([t for t, _ in parts])
    rows = np.concatenate([r for _, r in parts])
    order = np.argsort(targets, kind="stable")
    targets, rows = targets[order], rows[order]
    if targets.size > 1 and (np.diff(targets) == 0).any():
        raise ValueError(f"companion of '{target}': an element is targeted twice")
    return Companion(kind, target, targets, rows)


def build_companions(
    var: VariableLayout,
    *,
    halo: Mapping[str, int],
    cyclic: Sequence[str],
    level_dim: str | None,
    increment: str,
    also: Sequence[str],
) -> tuple[Companion, ...]:
    """The companions of one state variable (see the module docstring).

    Parameters
    ----------
    var : VariableLayout
        Its ``dims``, ``shape`` and rows (``active``): interior, one level.
    halo, cyclic : ``ensemble.halo``, ``ensemble.cyclic``
        Cyclic dims the variable lacks are ignored.
    level_dim : str or None
        ``ensemble.time_level.dim`` (ignored if the variable lacks it).
    increment : {"current", "all"}
        ``ensemble.time_level.increment``.
    also : sequence of str
        ``ensemble.variables[i].also``.

    Returns
    -------
    tuple of Companion
        The halo copies (``copy``, this variable), the other levels and their
        halo (``increment``, this variable), then per ``also`` variable one
        ``increment`` at the rows' elements and every element above.
    """
    elements = _positions(var.shape, var.active, var.size)
    every = np.arange(elements.size, dtype=np.int64)
    axes = {var.dims.index(d): int(halo[d]) for d in cyclic
            if d in var.dims and halo.get(d, 0) > 0}
    halo_t, halo_r = cyclic_targets(var.shape, elements, axes) if axes else (
        np.empty(0, np.int64), np.empty(0, np.int64))
    levels: list[tuple[np.ndarray, np.ndarray]] = []
    if increment == "all" and level_dim is not None and level_dim in var.dims:
        ax = var.dims.index(level_dim)
        levels = level_targets(var.shape, elements, ax)
        if halo_t.size:  # the other levels' halo cells follow their interior likewise
            levels += [(t, halo_r[r]) for t, r in level_targets(var.shape, halo_t, ax)]
    out = [
        _companion("copy", var.name, [(halo_t, halo_r)]),
        _companion("increment", var.name, levels),
    ]
    for name in also:
        out.append(_companion("increment", name,
                              [(elements, every), (halo_t, halo_r), *levels]))
    return tuple(c for c in out if c is not None)


def attach_companions(
    layout: StateLayout,
    ensemble: EnsembleSection,
    metas: Mapping[str, VarMeta] | None = None,
    source: str = "",
) -> StateLayout:
    """The layout with each variable's companions from the ``ensemble`` keys.

    Called by the layout builder once the rows (interior, state level, mask)
    are known. With ``metas`` (the first member's variables) every ``also``
    variable is checked: it exists and has the shape of its source
    (:class:`~ensio.errors.InputError` naming ``source`` and the key).
    """
    halo = dict(getattr(ensemble, "halo", None) or {})
    cyclic = tuple(getattr(ensemble, "cyclic", ()) or ())
    level = getattr(ensemble, "time_level", None)
    specs = {s.name: (i, s) for i, s in enumerate(ensemble.variables)}
    variables = []
    for v in layout.variables:
        i, spec = specs.get(v.name, (None, None))
        also = tuple(getattr(spec, "also", ()) or ())
        if metas is not None:
            for name in also:
                _check_also(metas, v, name, f"ensemble.variables[{i}].also", source)
        comps = build_companions(
            v, halo=halo, cyclic=cyclic, level_dim=level.dim if level is not None else None,
            increment=level.increment if level is not None else "current", also=also,
        )  # fmt: skip
        variables.append(dataclasses.replace(v, companions=comps) if comps else v)
    return dataclasses.replace(layout, variables=tuple(variables))


def _check_also(metas: Mapping[str, VarMeta], var: VariableLayout, name: str, key: str,
                source: str) -> None:
    meta = metas.get(name)
    if meta is None:
        raise InputError(f"{source}: {key}: variable '{name}' not found")
    if tuple(meta.shape) != tuple(var.shape):
        raise InputError(
            f"{source}: {key}: '{name}' has shape {tuple(meta.shape)}, "
            f"expected {tuple(var.shape)} as '{var.name}'"
        )
    kind = np.dtype(meta.dtype).kind
    packed = meta.encoding is not None and meta.encoding.packed
    if not (kind == "f" or (kind in "iu" and packed)):
        raise InputError(
            f"{source}: {key}: '{name}' has dtype {np.dtype(meta.dtype).name}; it must be "
            "float or an integer packed with scale_factor/add_offset"
        )


def companion_sources(layout: StateLayout) -> dict[str, str]:
    """``also`` variable → the state variable whose increment it receives."""
    state = {v.name for v in layout.variables}
    return {c.target: v.name for v in layout.variables for c in v.companions
            if c.target not in state}


# ------------------------------------------------------------------ the write-back itself
def changed_bytes(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Bool per element: the stored bytes differ (NaN == NaN, -0.0 != 0.0)."""
    width = np.dtype(f"u{new.dtype.itemsize}")
    return new.view(width) != old.view(width)


def write_back(
    stored: Mapping[str, np.ndarray],
    encodings: Mapping[str, Encoding],
    name: str,
    rows_at: np.ndarray,
    rows: np.ndarray,
    companions: Sequence[Companion],
) -> int:
    """The analysis into the stored values of its rows, then the companions; the clips.

    Pure: every array is modified in place, nothing is read or written.

    Parameters
    ----------
    stored : mapping of str to numpy.ndarray
        Per written variable, a flat array of stored (on-disk dtype) values
        holding the prior: the whole variable, or a buffer of some ranges.
    encodings : mapping of str to Encoding
        Each written variable's packing in this file.
    name : str
        The source variable.
    rows_at : numpy.ndarray
        int64 (r,), index in ``stored[name]`` of each row.
    rows : numpy.ndarray
        float64 (r,), the physical analysis of the rows (NaN: keep the prior).
    companions : sequence of Companion
        With ``target_elements`` indexing ``stored[target]`` and
        ``source_rows`` indexing ``rows``.

    Notes
    -----
    A row's stored value takes the packed analysis, or keeps its bytes where
    the analysis is not finite or (packed) leaves it unchanged
    (:meth:`Encoding.keep_prior`). Only where the row's bytes changed:
    a ``copy`` target takes exactly the row's new bytes, an ``increment``
    target its own physical value plus analysis − prior, packed with its own
    encoding (a missing target value stays missing).
    """
    enc = encodings[name]
    buf = stored[name]
    prior = buf[rows_at]
    new = np.empty_like(prior)
    clips = int(enc.encode(rows, new))
    enc.keep_prior(prior, rows, new)
    changed = changed_bytes(new, prior)
    buf[rows_at] = new
    inc = None
    for c in companions:
        target = stored[c.target]
        if c.kind == "copy":
            take = changed[c.source_rows]
            target[c.target_elements[take]] = new[c.source_rows[take]]
            continue
        if inc is None:
            before = np.empty(prior.shape, dtype=np.float64)
            enc.decode(prior, before)
            inc = rows - before
        clips += _increment(target, c.target_elements, encodings[c.target],
                            inc[c.source_rows], changed[c.source_rows])
    return clips


def _increment(stored: np.ndarray, at: np.ndarray, enc: Encoding, inc: np.ndarray,
               changed: np.ndarray) -> int:
    """``stored[at]`` := its physical value + ``inc`` where ``changed``, packed; the clips."""
    old = stored[at]
    phys = np.empty(old.shape, dtype=np.float64)
    enc.decode(old, phys)
    x = np.where(changed & np.isfinite(inc), phys + inc, np.nan)
    out = np.empty_like(old)
    clips = int(enc.encode(x, out))
    enc.keep_prior(old, x, out)
    stored[at] = out
    return clips

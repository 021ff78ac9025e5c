"""Checks of the post-processing keys of the ``ioserver:`` section (issue 27 item 6).

Interpolation targets (``domains[].interpolate``, ``axes[].interpolate``), a
field moved to such a grid, ``freq_offset``, ``precision: 2`` packing, region
reductions (``reduce``) and a file's time naming (``time_naming``,
``time_counter``, ``sync_freq``). Kept apart from :mod:`.configload` (which
calls them while it resolves fields and files) so that the loader stays the
place where the *structure* of an iodef is undone, and these stay the place
where the new keys' values are judged. Every problem is a one-line
:class:`~ensio.config.errors.ConfigError` naming the dotted key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import numpy as np

from ..config.errors import ConfigError
from .config import (
    OFFSET_RE,
    AxisDef,
    DomainDef,
    FieldDef,
    FileDef,
    GridDef,
    Reduce,
    check_freq,
)

__all__ = ["check_interp_defs", "check_interp", "check_offset", "offset_steps",
           "check_packing", "check_reduce", "read_regions", "check_file_time"]

_SECONDS = {"s": 1, "mi": 60, "h": 3600, "d": 86400}


class _Ctx(Protocol):
    grids: Mapping[str, GridDef]
    domains: Mapping[str, DomainDef]
    axes: Mapping[str, AxisDef]
    dt: int
    base_dir: Path


def check_interp_defs(domains: Mapping[str, DomainDef], axes: Mapping[str, AxisDef]) -> None:
    """Interpolation targets name an existing, different source of the right kind."""
    for d in domains.values():
        if d.interpolate is None:
            if d.lon is not None:
                raise ConfigError(f"ioserver.domains.{d.id}.lon: only an interpolation target "
                                  "has configured coordinates (the model sends the others)")
            continue
        key = f"ioserver.domains.{d.id}.interpolate.from"
        src = domains.get(d.interpolate.from_)
        if src is None:
            raise ConfigError(f"{key}: no domain {d.interpolate.from_!r}")
        if src.id == d.id:
            raise ConfigError(f"{key}: a domain cannot be interpolated from itself")
        if src.type != "rectilinear":
            raise ConfigError(f"{key}: domain {src.id!r} is {src.type}; interpolation "
                              "needs a rectilinear source")
        if src.interpolate is not None:
            raise ConfigError(f"{key}: domain {src.id!r} is itself an interpolation target")
    for a in axes.values():
        if a.interpolate is None:
            continue
        key = f"ioserver.axes.{a.id}.interpolate.from"
        src = axes.get(a.interpolate.from_)
        if src is None:
            raise ConfigError(f"{key}: no axis {a.interpolate.from_!r}")
        if src.id == a.id:
            raise ConfigError(f"{key}: an axis cannot be interpolated from itself")
        for ax in (a, src):
            if ax.values is None:
                raise ConfigError(f"ioserver.axes.{ax.id}.values: required for vertical "
                                  "interpolation (the level coordinate)")
        v = np.asarray(src.values, dtype=np.float64)
        d = np.diff(v)
        if v.size > 1 and not (np.all(d > 0) or np.all(d < 0)):
            raise ConfigError(f"ioserver.axes.{src.id}.values: must be strictly monotonic "
                              "(the source of a vertical interpolation)")


def check_interp(fd: FieldDef, key: str, ctx: _Ctx) -> None:
    """A field whose grid differs from its data's grid is declared as an interpolation."""
    if not fd.interpolated:
        return
    src, dst = ctx.grids[fd.in_grid], ctx.grids[fd.grid]
    where = f"{key}.grid"
    if src.domain != dst.domain:
        di = ctx.domains[dst.domain].interpolate
        if di is None or di.from_ != src.domain:
            raise ConfigError(
                f"{where}: {fd.grid!r} (domain {dst.domain!r}) is not the grid "
                f"{src.id!r} of the data (domain {src.domain!r}); give domain "
                f"{dst.domain!r} interpolate: {{from: {src.domain}}}")
    if src.axis != dst.axis:
        ai = ctx.axes[dst.axis].interpolate if dst.axis is not None else None
        if ai is None or ai.from_ != src.axis:
            raise ConfigError(
                f"{where}: axis {dst.axis!r} of grid {fd.grid!r} is not the data's axis "
                f"{src.axis!r}; give axis {dst.axis!r} interpolate: {{from: {src.axis}}}")
    if fd.extract is not None:
        raise ConfigError(f"{key}.extract: not with an interpolated field")


def offset_steps(text: str, dt: int) -> int:
    """A ``freq_offset`` in whole model steps (checked by :func:`check_offset`)."""
    m = OFFSET_RE.match(text)
    assert m is not None
    n, unit = int(m.group(1)), m.group(2)
    return n if unit == "ts" else n * _SECONDS[unit] // dt


def check_offset(value: str | None, key: str, dt: int) -> None:
    """``freq_offset``: a fixed duration (zero allowed) of a whole number of steps."""
    if value is None:
        return
    m = OFFSET_RE.match(value)
    if m is None:
        raise ConfigError(f"{key}: {value!r} is not a duration (a count >= 0 and one of "
                          "ts s mi h d, e.g. 0ts or 1h)")
    n, unit = int(m.group(1)), m.group(2)
    if unit != "ts" and (n * _SECONDS[unit]) % dt:
        raise ConfigError(f"{key}: {value!r} is not a whole number of model steps "
                          f"({dt} s)")


def check_packing(fd: FieldDef, key: str) -> None:
    """``precision: 2`` has one packing: ``scale_factor`` (+ ``add_offset``) or
    ``valid_min``/``valid_max``; other precisions take neither."""
    given = [k for k in ("scale_factor", "add_offset", "valid_min", "valid_max")
             if getattr(fd, k) is not None]
    if fd.precision != 2:
        if given and fd.precision in (4, 8) and set(given) & {"scale_factor", "add_offset"}:
            raise ConfigError(f"{key}.{given[0]}: packing needs precision: 2")
        return
    if fd.scale_factor is not None:
        if fd.valid_min is not None or fd.valid_max is not None:
            raise ConfigError(f"{key}.valid_min: give scale_factor/add_offset or "
                              "valid_min/valid_max, not both")
        if not fd.scale_factor > 0:
            raise ConfigError(f"{key}.scale_factor: must be positive, got {fd.scale_factor}")
        return
    if fd.valid_min is None or fd.valid_max is None:
        raise ConfigError(f"{key}.precision: 2 (16-bit packing) needs valid_min and "
                          "valid_max, or scale_factor (and add_offset)")
    if not fd.valid_min < fd.valid_max:
        raise ConfigError(f"{key}.valid_max: {fd.valid_max} must exceed valid_min "
                          f"{fd.valid_min}")


def read_regions(path: Path, variable: str, hshape: tuple[int, ...], where: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Region masks ``(nregion, *hshape)`` bool and the region numbers ``(nregion,)``.

    The variable holds region ids on the horizontal grid (regions = the distinct
    ids > 0; fill and ids <= 0 belong to none) or a 0/1 stack ``(nregion, *hshape)``.
    """
    import netCDF4

    try:
        with netCDF4.Dataset(path) as ds:
            if variable not in ds.variables:
                raise ConfigError(f"{where}.variable: no variable {variable!r} in {path}")
            v = ds[variable]
            v.set_auto_mask(True)
            raw = np.ma.filled(np.ma.asarray(v[...]).astype(np.float64), np.nan)
    except OSError as exc:
        raise ConfigError(f"{where}.file: cannot read {path}: {exc}") from None
    if raw.shape == hshape:
        ids = np.unique(raw[np.isfinite(raw) & (raw > 0)])
        if ids.size == 0:
            raise ConfigError(f"{where}: {path}:{variable} holds no region id > 0")
        return np.stack([raw == i for i in ids]), ids.astype(np.int64)
    if raw.ndim == len(hshape) + 1 and raw.shape[1:] == hshape:
        masks = np.nan_to_num(raw) != 0
        return masks, np.arange(1, raw.shape[0] + 1, dtype=np.int64)
    raise ConfigError(f"{where}: {path}:{variable} has shape {raw.shape}, expected "
                      f"{hshape} (region ids) or (nregion, {', '.join(map(str, hshape))})")


def check_reduce(fd: FieldDef, key: str, ctx: _Ctx) -> Reduce:
    """``reduce``: no other spatial operation; the mask file readable, on the field's grid.
    Returns the reduction with the mask path made absolute (relative to the config)."""
    red = fd.reduce
    assert red is not None
    for other in ("extract", "mean"):
        if getattr(fd, other) is not None:
            raise ConfigError(f"{key}.reduce: not with {other}")
    path = red.mask.file if red.mask.file.is_absolute() else ctx.base_dir / red.mask.file
    hshape = ctx.domains[ctx.grids[fd.grid].domain].shape
    read_regions(path, red.mask.variable, hshape, f"{key}.reduce.mask")
    return replace(red, mask=replace(red.mask, file=path))


def check_file_time(fd: FileDef, key: str) -> None:
    """``sync_freq`` is a frequency; ``time_counter``/``time_counter_name`` are XIOS naming."""
    if fd.sync_freq is not None:
        check_freq(fd.sync_freq, f"{key}.sync_freq")
    if fd.time_naming == "cf":
        if fd.time_counter != "centered" or fd.time_counter_name != "time_counter":
            what = "time_counter" if fd.time_counter != "centered" else "time_counter_name"
            raise ConfigError(f"{key}.{what}: needs time_naming: xios")
        return
    from .config import check_id

    check_id(fd.time_counter_name, f"{key}.time_counter_name")
    names = {f.name for f in fd.fields if f.enabled}
    reserved = {fd.time_counter_name, f"{fd.time_counter_name}_bounds", "time_centered",
                "time_centered_bounds", "time_instant", "time_instant_bounds", "axis_nbounds"}
    clash = sorted(names & reserved)
    if clash:
        raise ConfigError(f"{key}.fields: field name {clash[0]!r} is reserved by "
                          "time_naming: xios")

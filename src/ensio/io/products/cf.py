"""CF conventions for the product files (analysis mean and spread).

Pure functions on netCDF attributes and numpy arrays (no MPI, no writing):
which variables of a member a product must carry so that it stays a valid
CF field (coordinates, bounds, grid mappings, auxiliary coordinates, formula
terms, cell measures), which points of a member are missing, what dtype and
fill value a product variable gets, the attributes that describe a statistic
over the ensemble, and the timestamped ``history`` line.

Packed members (``scale_factor``/``add_offset``) give products written
*unpacked*, in the physical dtype (the type of the packing attributes, as the
netCDF User Guide says): the attributes in packed units (``scale_factor``,
``add_offset``, ``valid_*``, ``_Unsigned``) are dropped and the fill value is
the netCDF default of the physical dtype.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import netCDF4
import numpy as np

__all__ = [
    "MEAN",
    "SPREAD",
    "STATISTICS",
    "FieldEncoding",
    "Statistic",
    "field_encoding",
    "history_line",
    "missing_mask",
    "prepend_history",
    "product_attributes",
    "referenced_variables",
]

#: Variable attributes whose value names other variables of the file.
_REFERENCING = ("bounds", "climatology", "coordinates", "grid_mapping", "cell_measures",
                "formula_terms")
#: Attributes in packed units, meaningless once a product is written unpacked.
_PACKED_ONLY = ("scale_factor", "add_offset", "valid_min", "valid_max", "valid_range",
                "_Unsigned", "missing_value", "_FillValue")
_VALID = ("valid_min", "valid_max", "valid_range")


@dataclass(frozen=True)
class Statistic:
    """A statistic over the members, and how a product of it is described.

    Attributes
    ----------
    name : {"mean", "spread"}
    method : str
        The CF ``cell_methods`` method over the ensemble axis (``realization``).
    long_name : str or None
        Format of the product's ``long_name`` (``{long_name}`` is the
        member's), or ``None`` to keep the member's.
    same_quantity : bool
        The product is the member's quantity (``standard_name`` and valid
        range still apply); a spread is not.
    """

    name: Literal["mean", "spread"]
    method: str
    long_name: str | None
    same_quantity: bool


MEAN = Statistic("mean", "mean", None, True)
SPREAD = Statistic(
    "spread", "standard_deviation",
    "ensemble spread (standard deviation, ddof={ddof}) of {long_name}", False,
)  # fmt: skip
STATISTICS: dict[str, Statistic] = {s.name: s for s in (MEAN, SPREAD)}


@dataclass(frozen=True)
class FieldEncoding:
    """How a product variable stores a member's field.

    Attributes
    ----------
    dtype : numpy.dtype
        Physical dtype (the member's float dtype; the packing attributes'
        dtype for packed members; float64 if those are not floating).
    fill : float
        Value of masked points (``_FillValue``, else the first
        ``missing_value``, else the netCDF default of ``dtype``).
    fill_attribute : bool
        Whether the product declares ``fill`` as ``_FillValue``.
    packed : bool
        The member is packed (``scale_factor`` or ``add_offset``).
    """

    dtype: np.dtype
    fill: float
    fill_attribute: bool
    packed: bool


def referenced_variables(
    variables: Mapping[str, Any], names: Iterable[str]
) -> list[str]:
    """Names of the variables the fields ``names`` need, in file order, ``names`` excluded.

    Follows, to a fixed point: the coordinate variable of every dimension,
    and every variable named by ``bounds``, ``climatology``, ``coordinates``,
    ``grid_mapping`` (also the ``crs: lat lon`` form), ``cell_measures`` and
    ``formula_terms``. Names not in the file (e.g. external cell measures)
    are ignored.

    Parameters
    ----------
    variables : mapping
        ``Dataset.variables`` (anything with ``.dimensions`` and ``ncattrs()``).
    names : iterable of str
        The fields, e.g. the state variables and the configured coordinates.
    """
    wanted = [n for n in names if n in variables]
    seen = set(wanted)
    todo = list(wanted)
    while todo:
        var = variables[todo.pop()]
        refs = [d for d in var.dimensions]
        for attr in _REFERENCING:
            if attr in var.ncattrs():
                refs += _names_in(attr, str(var.getncattr(attr)))
        for ref in refs:
            if ref in variables and ref not in seen:
                seen.add(ref)
                todo.append(ref)
    first = set(names)
    return [n for n in variables if n in seen and n not in first]


def _names_in(attr: str, text: str) -> list[str]:
    """Variable names in a referencing attribute's value (``key:`` tokens skipped)."""
    tokens = text.replace(":", ": ").split()
    if attr in ("cell_measures", "formula_terms"):
        # "area: cell_area" / "a: ap b: b ps: ps": the names follow the keys
        return [t for t in tokens if not t.endswith(":")]
    if attr == "grid_mapping":
        # "crs" or "crs: lat lon crs2: x y": mapping names and coordinate names
        return [t.rstrip(":") for t in tokens]
    return tokens


def missing_mask(raw: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """Points of a variable that are missing by the netCDF/CF conventions.

    Compared with the stored (packed) values: ``_FillValue``, every
    ``missing_value``, values outside ``valid_min``/``valid_max``/
    ``valid_range``, and NaN; without ``_FillValue`` the netCDF default fill
    value of the dtype (as the netCDF library and netCDF4-python read it),
    except for byte types.

    Parameters
    ----------
    raw : ndarray
        The variable as stored (no scaling, no masking), any shape.
    attrs : mapping
        Its attributes.

    Returns
    -------
    ndarray of bool, shape of ``raw``
    """
    mask = np.zeros(raw.shape, dtype=bool)
    if raw.dtype.kind == "f":
        mask |= np.isnan(raw)
    fills = []
    if "_FillValue" in attrs:
        fills.append(attrs["_FillValue"])
    elif raw.dtype.itemsize > 1 and raw.dtype.str[1:] in netCDF4.default_fillvals:
        fills.append(netCDF4.default_fillvals[raw.dtype.str[1:]])
    fills += list(np.atleast_1d(attrs.get("missing_value", [])))
    for f in fills:
        mask |= raw == np.asarray(f).astype(raw.dtype)
    if "valid_range" in attrs:
        lo, hi = np.asarray(attrs["valid_range"]).ravel()[:2]
        mask |= (raw < lo) | (raw > hi)
    if "valid_min" in attrs:
        mask |= raw < np.asarray(attrs["valid_min"]).ravel()[0]
    if "valid_max" in attrs:
        mask |= raw > np.asarray(attrs["valid_max"]).ravel()[0]
    return mask


def field_encoding(stored: np.dtype, attrs: Mapping[str, Any]) -> FieldEncoding:
    """The dtype and fill value of a product of a member variable (see :class:`FieldEncoding`)."""
    stored = np.dtype(stored).newbyteorder("=")  # products are written in native order
    packing = [np.asarray(attrs[a]).dtype for a in ("scale_factor", "add_offset") if a in attrs]
    if packing:
        dtype = np.result_type(*packing, stored if stored.kind == "f" else packing[0])
        if dtype.kind != "f":
            dtype = np.dtype("f8")
        return FieldEncoding(dtype, _default_fill(dtype), True, True)
    dtype = stored if stored.kind == "f" else np.dtype("f8")
    if "_FillValue" in attrs:
        return FieldEncoding(dtype, float(np.asarray(attrs["_FillValue"]).ravel()[0]), True, False)
    if "missing_value" in attrs:
        return FieldEncoding(
            dtype, float(np.asarray(attrs["missing_value"]).ravel()[0]), False, False
        )
    return FieldEncoding(dtype, _default_fill(dtype), True, False)


def _default_fill(dtype: np.dtype) -> float:
    return float(netCDF4.default_fillvals[np.dtype(dtype).str[1:]])


def product_attributes(
    attrs: Mapping[str, Any],
    name: str,
    enc: FieldEncoding,
    statistic: Statistic | None,
    ddof: int = 1,
) -> dict[str, Any]:
    """The attributes of a product variable made from a member variable's ``attrs``.

    ``_FillValue`` is not among them (it is set when the variable is
    created: ``enc.fill`` if ``enc.fill_attribute``). Packed members lose the
    attributes in packed units and get ``missing_value = enc.fill`` if they
    had one. A statistic adds ``realization: METHOD`` to ``cell_methods``;
    a spread loses ``standard_name`` and the valid range and gets a
    ``long_name`` that says what it is. ``actual_range`` and
    ``ancillary_variables`` (about the member's values) are dropped.
    """
    out = {k: v for k, v in attrs.items()
           if k not in ("_FillValue", "actual_range", "ancillary_variables")}
    if enc.packed:
        had_missing = "missing_value" in out
        out = {k: v for k, v in out.items() if k not in _PACKED_ONLY}
        if had_missing:
            out["missing_value"] = enc.dtype.type(enc.fill)
    if statistic is None:
        return out
    if not statistic.same_quantity:
        described = out.pop("standard_name", None)
        for k in _VALID:
            out.pop(k, None)
        if statistic.long_name is not None:
            what = str(out.get("long_name", described or name))
            out["long_name"] = statistic.long_name.format(ddof=ddof, long_name=what)
    method = f"realization: {statistic.method}"
    old = str(out.get("cell_methods", "")).strip()
    out["cell_methods"] = f"{old} {method}" if old else method
    return out


def history_line(text: str, now: datetime.datetime | None = None) -> str:
    """``text`` behind an ISO-8601 UTC timestamp: ``2026-11-25T03:14:10Z: text``."""
    now = now or datetime.datetime.now(datetime.UTC)
    return f"{now.astimezone(datetime.UTC):%Y-%m-%dT%H:%M:%SZ}: {text}"


def prepend_history(old: str, line: str) -> str:
    """The ``history`` attribute with ``line`` first (newest first, as NCO and CDO do)."""
    old = old.strip("\n")
    return f"{line}\n{old}" if old else line

"""How a state variable's stored values map to physical values: packing and missing data.

One :class:`Encoding` per variable of a member file, built from its netCDF
attributes by :meth:`Encoding.from_attributes`. The file formats read the
attributes, the ensemble I/O converts each segment with :meth:`Encoding.decode`
(stored → float64, missing → NaN) and :meth:`Encoding.encode` (float64 →
stored, rounded and clipped). It lives in ``layout/`` because the layout
decides which variables can be state variables (a packed ``short`` can, an
unpacked one cannot) and the products keep the members' conventions.

The rules (netCDF Users Guide "Attribute conventions", CF §2.5.1 and §8.1),
all applied to the **stored (packed)** values, before any scaling:

* missing: NaN or ±inf (floating types); equal to ``_FillValue``; equal to any
  value of ``missing_value`` (scalar or vector); below ``valid_min`` or above
  ``valid_max`` (``valid_range`` = both, and wins over them). Without a
  ``_FillValue`` attribute the netCDF default fill value of the type
  (``NC_FILL_FLOAT`` = 9.96921e36, ``NC_FILL_SHORT`` = −32767, …) is missing,
  except for byte and ubyte, which have no default fill (netCDF-C, ncdump and
  netCDF4-python read them the same way). An attribute value that the stored
  type cannot hold (e.g. ``_FillValue = -9e33f`` left on a ``short`` by a
  careless pack) can match no stored value and is ignored. The NUG's advice
  to derive a valid range from the fill value is not applied (as
  netCDF4-python and xarray).
* physical value: ``x = raw * scale_factor + add_offset`` in float64 (either
  attribute alone is allowed).
* writing: ``raw = (x - add_offset) / scale_factor``, rounded half to even and
  clipped for integer types to the valid range (or the type's range), never
  onto the fill value or a ``missing_value``; cast for floating types (clipped
  to ``valid_min``/``valid_max`` if given). Every clip is counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CONVENTION_ATTRIBUTES", "DEFAULT_FILL", "PLAIN", "Encoding", "default_fill"]

#: The attributes :meth:`Encoding.from_attributes` looks at.
CONVENTION_ATTRIBUTES = (
    "_FillValue",
    "missing_value",
    "valid_min",
    "valid_max",
    "valid_range",
    "scale_factor",
    "add_offset",
    "_Unsigned",
)

#: netCDF-C's default fill values (``NC_FILL_*``) by dtype character code; no
#: default for byte/ubyte (see the module docstring).
DEFAULT_FILL: dict[str, float | int] = {
    "h": -32767,
    "i": -2147483647,
    "l": -9223372036854775806,
    "q": -9223372036854775806,
    "H": 65535,
    "I": 4294967295,
    "L": 18446744073709551614,
    "Q": 18446744073709551614,
    "f": float(np.float32(9.9692099683868690e36)),
    "d": 9.9692099683868690e36,
}


def default_fill(dtype: np.dtype) -> float | int | None:
    """The netCDF default fill value of a stored dtype, or ``None`` (bytes, others)."""
    return DEFAULT_FILL.get(np.dtype(dtype).char)


def _first(attrs: Mapping[str, Any], name: str) -> float | None:
    v = attrs.get(name)
    if v is None:
        return None
    arr = np.asarray(v).reshape(-1)
    if arr.size == 0 or arr.dtype.kind not in "iuf":
        return None
    return float(arr[0])


def _as_stored(value: Any, dtype: np.dtype) -> float | int | None:
    """``value`` as the stored type would hold it, or ``None`` if it cannot."""
    v = np.asarray(value).reshape(-1)
    if v.size != 1 or v.dtype.kind not in "iuf":
        return None
    v = v[0]
    if dtype.kind == "f":
        if np.isnan(v):
            return float("nan")
        with np.errstate(over="ignore"):
            cast = dtype.type(v)
        return float(cast) if np.isfinite(cast) else None
    if not np.isfinite(v) or float(v) != np.floor(float(v)):
        return None
    info = np.iinfo(dtype)
    iv = int(v)
    return iv if info.min <= iv <= info.max else None


def _text(value: Any) -> str:
    """A text attribute's value (``str``, ``bytes`` or a char array), stripped."""
    if value is None:
        return ""
    a = np.asarray(value)
    if a.dtype.kind in "SU":
        first = a.reshape(-1)[0] if a.size else ""
        if a.dtype.kind == "S" and a.size > 1:
            first = b"".join(a.reshape(-1))
        return (first.decode(errors="replace") if isinstance(first, bytes) else str(first)).strip()
    return str(value).strip()


@dataclass(frozen=True)
class Encoding:
    """The packing and missing-data conventions of one variable.

    Attributes
    ----------
    dtype : numpy.dtype
        Stored dtype, native byte order.
    scale, offset : float or None
        ``scale_factor``, ``add_offset`` (``None``: absent).
    fill : float, int or None
        The fill value in the stored type: ``_FillValue``, else the default
        fill of the type (``None`` for bytes); NaN is allowed.
    missing : tuple
        ``missing_value`` entries the stored type can hold.
    valid_min, valid_max : float or None
        In stored units.
    unsigned : bool
        ``_Unsigned = "true"`` on a signed integer type (netCDF-3 has no
        unsigned types; the data are unsigned). Not decoded: a state
        variable with it is refused (:func:`ensio.layout.state.check_state_dtype`)
        rather than analysed with the wrong sign.
    """

    dtype: np.dtype
    scale: float | None = None
    offset: float | None = None
    fill: float | int | None = None
    missing: tuple[float | int, ...] = ()
    valid_min: float | None = None
    valid_max: float | None = None
    unsigned: bool = False

    @classmethod
    def from_attributes(cls, dtype: np.dtype, attrs: Mapping[str, Any]) -> Encoding:
        """The encoding of a variable of stored ``dtype`` with these attributes.

        ``attrs`` maps attribute names (see :data:`CONVENTION_ATTRIBUTES`) to
        their values (scalars or 1-D arrays); other names are ignored.
        """
        dtype = np.dtype(dtype).newbyteorder("=")
        if dtype.kind not in "iuf":
            return cls(dtype)
        if "_FillValue" in attrs:
            fill = _as_stored(np.asarray(attrs["_FillValue"]).reshape(-1)[:1], dtype)
        else:
            fill = default_fill(dtype)
        listed = np.asarray(attrs.get("missing_value", [])).reshape(-1)
        missing = tuple(m for m in (_as_stored(v, dtype) for v in listed) if m is not None)
        vmin, vmax = _first(attrs, "valid_min"), _first(attrs, "valid_max")
        vr = attrs.get("valid_range")
        if vr is not None and np.asarray(vr).size == 2 and np.asarray(vr).dtype.kind in "iuf":
            vmin, vmax = (float(x) for x in np.asarray(vr).reshape(-1))
        return cls(
            unsigned=dtype.kind == "i" and _text(attrs.get("_Unsigned")).lower() == "true",
            dtype=dtype,
            scale=_first(attrs, "scale_factor"),
            offset=_first(attrs, "add_offset"),
            fill=fill,
            missing=missing,
            valid_min=vmin,
            valid_max=vmax,
        )

    @property
    def packed(self) -> bool:
        """``scale_factor`` or ``add_offset`` is present: stored ≠ physical."""
        return self.scale is not None or self.offset is not None

    def _markers(self) -> list[float | int]:
        """Stored values that mean "missing" (not NaN: that is checked separately)."""
        out = [] if self.fill is None else [self.fill]
        out += list(self.missing)
        return [v for v in out if not (isinstance(v, float) and np.isnan(v))]

    def missing_mask(self, raw: np.ndarray) -> np.ndarray:
        """True where a stored value is missing (see the module docstring)."""
        if self.dtype.kind == "f":
            mask = ~np.isfinite(raw)
        else:
            mask = np.zeros(raw.shape, dtype=bool)
        for v in self._markers():
            mask |= raw == v
        if self.valid_min is not None:
            mask |= raw < self.valid_min
        if self.valid_max is not None:
            mask |= raw > self.valid_max
        return mask

    def _none_missing(self, raw: np.ndarray) -> bool:
        """True if no stored value of floating ``raw`` can be missing (two reductions).

        The usual case of a state variable. ``min``/``max`` propagate NaN, so
        finite extremes mean every value is finite; markers and the valid
        range are then checked against the extremes only. Cheaper than
        building the mask (several passes and temporaries over the segment).
        """
        if self.dtype.kind != "f" or raw.size == 0:
            return False
        lo, hi = float(np.min(raw)), float(np.max(raw))
        if not (np.isfinite(lo) and np.isfinite(hi)):
            return False
        if any(lo <= float(v) <= hi for v in self._markers()):
            return False
        return (self.valid_min is None or lo >= self.valid_min) and (
            self.valid_max is None or hi <= self.valid_max
        )

    def decode(self, raw: np.ndarray, out: np.ndarray) -> bool:
        """Stored values → physical float64 into ``out`` (missing → NaN).

        ``out`` may be ``raw`` itself (native float64 segments are converted
        in place). Returns False only if every value of ``out`` is known to
        be finite (none missing, no packing arithmetic that could overflow):
        a caller may then skip looking for NaN.
        """
        clean = self._none_missing(raw)
        mask = None if clean else self.missing_mask(raw)
        if out is not raw:
            out[...] = raw
        if self.scale is not None:
            out *= self.scale
        if self.offset is not None:
            out += self.offset
        if mask is None:
            return self.packed
        out[mask] = np.nan
        return True

    def encode(self, x: np.ndarray, out: np.ndarray) -> int:
        """Physical float64 ``x`` → stored values in ``out`` (any byte order); returns the clips.

        Non-finite ``x`` are stored as 0 (or the lowest valid value): the
        writer never keeps them (it puts the prior bytes back there).
        """
        y = np.asarray(x, dtype=np.float64)
        if not self.packed and self.valid_min is None and self.valid_max is None:
            out[...] = y  # a plain floating variable: the cast is all
            return 0
        finite = np.isfinite(y)
        if self.packed:
            y = y - (self.offset or 0.0)
            if self.scale is not None:
                y /= self.scale
        else:
            y = y.copy()
        lo, hi = self._bounds()
        if self.dtype.kind in "iu":
            np.rint(y, out=y)
        with np.errstate(invalid="ignore"):
            outside = finite & ((y < lo) | (y > hi))
        clips = int(outside.sum())
        y[~finite] = min(max(0.0, lo), hi)
        np.clip(y, lo, hi, out=y)
        if self.dtype.kind in "iu":
            clips += self._avoid_markers(y, finite, lo, hi)
        out[...] = y
        return clips

    def keep_prior(self, prior: np.ndarray, x: np.ndarray, new: np.ndarray) -> None:
        """Put the ``prior`` stored values back into ``new`` where ``x`` changes nothing.

        That is where ``x`` is not finite (an inactive point: its bytes stay)
        and, for a packed variable, where ``x`` equals the prior's physical
        value: re-packing an unchanged value could move it by a rounding step
        (e.g. a float with a large ``add_offset``), so an identity analysis
        leaves the file byte-identical.
        """
        keep = ~np.isfinite(x)
        if self.packed:
            old = np.empty(prior.shape, dtype=np.float64)
            self.decode(prior, old)
            keep |= old == x
        new[keep] = prior[keep]

    def _bounds(self) -> tuple[float, float]:
        """The range written values are clipped to (stored units), markers at its ends excluded."""
        if self.dtype.kind in "iu":
            info = np.iinfo(self.dtype)
            lo, hi = float(info.min), float(info.max)
        else:
            lo, hi = -np.inf, np.inf
        if self.valid_min is not None:
            lo = max(lo, self.valid_min)
        if self.valid_max is not None:
            hi = min(hi, self.valid_max)
        if self.dtype.kind in "iu":
            lo, hi = float(np.ceil(lo)), float(np.floor(hi))
            markers = set(self._markers())
            while lo in markers and lo < hi:
                lo += 1
            while hi in markers and hi > lo:
                hi -= 1
        return lo, hi

    def _avoid_markers(self, y: np.ndarray, finite: np.ndarray, lo: float, hi: float) -> int:
        """Move rounded values that landed on a missing marker inside the range to a neighbour."""
        moved = 0
        markers = set(self._markers())
        for v in sorted(markers):
            if not lo < v < hi:
                continue
            hit = finite & (y == v)
            n = int(hit.sum())
            if n:
                up = v + 1 <= hi and v + 1 not in markers
                y[hit] = v + 1 if up else v - 1
                moved += n
        return moved


#: The encoding of a plain float64 variable without attributes (tests, API blocks).
PLAIN = Encoding(np.dtype(np.float64), fill=DEFAULT_FILL["d"])

"""The observation batch: values, errors and where they are."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ObsBatch"]


def _vec(name: str, a: object, dtype: type) -> np.ndarray:
    v = np.asarray(a, dtype=dtype)
    if v.ndim != 1:
        raise ValueError(f"ObsBatch.{name}: expected a 1-D array, got shape {v.shape}")
    return v


@dataclass(frozen=True, eq=False)
class ObsBatch:
    """A set of observations (format of DESIGN.md, "Conventions").

    Attributes
    ----------
    values : ndarray, shape (m,)
    errors : ndarray, shape (m,)
        Error standard deviations σ_o (R is diagonal, ``σ_o²``).
    lon, lat : ndarray, shape (m,)
        Location in degrees.
    index : ndarray of int, shape (m,), or None
        0-based state-vector row observed directly (H = identity there);
        negative or ``None``: H is bilinear interpolation on the lon/lat grid.
    ids : ndarray of int, shape (m,), or None
        Global observation numbers: they key the EnKF perturbation streams
        and order the observations, so they must not depend on how the
        observations were split. ``None`` means ``0 .. m-1``. Give files after
        the first an offset (the total size of the files before them).
    variable : ndarray of int, shape (m,), or None
        Observed state variable (its position in the layout, config order)
        of observations without an index; negative or ``None``: the first.
    level : ndarray, shape (m,), or None
        Vertical position on a 3-D variable, a value of its level coordinate
        (linear interpolation between the two nearest levels); NaN: none.
    level_index : ndarray of int, shape (m,), or None
        Vertical position as a 0-based level; negative: none.
    time : ndarray, shape (m,), or None
        Observation time in the unit and reference of ``analysis.window``
        (e.g. hours relative to the analysis time); NaN: none. Used only by
        a 4-D analysis (``analysis.time_slots``).
    """

    values: np.ndarray
    errors: np.ndarray
    lon: np.ndarray
    lat: np.ndarray
    index: np.ndarray | None = None
    ids: np.ndarray | None = None
    variable: np.ndarray | None = None
    level: np.ndarray | None = None
    level_index: np.ndarray | None = None
    time: np.ndarray | None = None

    def __post_init__(self) -> None:
        vals = _vec("values", self.values, float)
        m = vals.size
        fields = {"values": vals}
        for name in ("errors", "lon", "lat"):
            fields[name] = _vec(name, getattr(self, name), float)
        for name, dtype in _OPTIONAL.items():
            v = getattr(self, name)
            fields[name] = None if v is None else _vec(name, v, dtype)
        if fields["ids"] is None:
            fields["ids"] = np.arange(m, dtype=np.int64)
        for name, v in fields.items():
            if v is not None and v.size != m:
                raise ValueError(f"ObsBatch.{name}: {v.size} entries, values has {m}")
            object.__setattr__(self, name, v)

    def __len__(self) -> int:
        return int(self.values.size)

    def subset(self, selection: np.ndarray) -> ObsBatch:
        """Observations selected by a boolean mask or an index array (ids kept)."""
        sel = np.asarray(selection)
        opt = {n: None if getattr(self, n) is None else getattr(self, n)[sel] for n in _OPTIONAL}
        return ObsBatch(
            values=self.values[sel],
            errors=self.errors[sel],
            lon=self.lon[sel],
            lat=self.lat[sel],
            **opt,
        )

    @staticmethod
    def concat(batches: Sequence[ObsBatch]) -> ObsBatch:
        """Concatenate batches, keeping their ids (give each file its own offset)."""
        if not batches:
            return ObsBatch(np.empty(0), np.empty(0), np.empty(0), np.empty(0))
        opt: dict[str, np.ndarray | None] = {}
        for name, dtype in _OPTIONAL.items():
            parts = [getattr(b, name) for b in batches]
            if all(p is None for p in parts):
                opt[name] = None
                continue
            missing = np.nan if dtype is float else -1
            opt[name] = np.concatenate(
                [
                    p if p is not None else np.full(len(b), missing, dtype)
                    for p, b in zip(parts, batches, strict=True)
                ]
            )
        ids = opt["ids"]
        assert ids is not None
        s = np.sort(ids)  # not np.unique: its hash path is ~20x slower on 1e6 ids (numpy 2.4)
        if np.any(s[1:] == s[:-1]):
            raise ValueError("ObsBatch.concat: observation ids repeat; offset the ids per file")
        return ObsBatch(
            values=np.concatenate([b.values for b in batches]),
            errors=np.concatenate([b.errors for b in batches]),
            lon=np.concatenate([b.lon for b in batches]),
            lat=np.concatenate([b.lat for b in batches]),
            **opt,
        )


#: Optional per-observation fields, their dtype (missing: -1 for integers, NaN for floats).
_OPTIONAL: dict[str, type] = {
    "index": np.int64,
    "ids": np.int64,
    "variable": np.int64,
    "level": float,
    "level_index": np.int64,
    "time": float,
}

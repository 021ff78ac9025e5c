"""The time variables of an output file: CF names (``time``) or XIOS's (``time_counter``).

One file's time axis is spelled once here, so the writer (:mod:`.writer`)
never names a time variable itself: it calls :meth:`TimeAxis.define` when it
creates a file, :meth:`TimeAxis.put` for each new record and
:meth:`TimeAxis.put_instant` for the sample time of instant fields.

``time_naming: cf`` (the default): dimension and coordinate variable ``time``
(the period midpoint) with ``time_bnds(time, nv)``; ``time_instant`` for the
instant fields' sample times.

``time_naming: xios`` (what XIOS writes, so post-processing scripts written
for XIOS output run unchanged): unlimited dimension ``time_counter`` (or
``time_counter_name``), bounds dimension ``axis_nbounds``, auxiliary
coordinates ``time_centered`` (+ ``time_centered_bounds``) and, with instant
fields, ``time_instant`` (+ ``time_instant_bounds``, both ends at the sample
time); the coordinate variable ``time_counter`` (+ ``time_counter_bounds``)
holds what ``time_counter`` says: ``centered`` (the midpoints, default),
``instant`` (the sample times), ``record`` (the record number, 1-based,
without time units) or ``none`` (no variable: the dimension only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["TimeAxis", "time_axis", "Writer"]

#: ``write(record, variable name, value)``: how the writer stores one record of a
#: time variable (the writer owns the file; this module only names and fills).
Writer = Callable[[int, str, Any], None]


@dataclass(frozen=True)
class TimeAxis:
    """Names of one file's time variables and how they are filled."""

    dim: str                      #: the unlimited dimension
    nv: str                       #: the bounds dimension (size 2)
    centered: str                 #: period midpoints
    centered_bounds: str
    instant: str                  #: sample time of instant fields
    instant_bounds: str | None    #: None in CF naming
    counter: str | None           #: XIOS's coordinate variable (None: CF, or ``none``)
    counter_holds: str            #: centered | instant | record | none
    has_instant: bool

    @property
    def reserved(self) -> set[str]:
        """Names no data variable may take."""
        names = {self.dim, self.nv, self.centered, self.centered_bounds, self.instant}
        for extra in (self.instant_bounds, self.counter):
            if extra is not None:
                names.add(extra)
        if self.counter is not None:
            names.add(f"{self.counter}_bounds")
        return names

    def coordinates(self, instant: bool) -> list[str]:
        """What a timed data variable's ``coordinates`` attribute names."""
        if instant:
            return [self.instant]
        return [] if self.counter is None and self.centered == self.dim else [self.centered]

    def define(self, ds: Any, units: str, calendar: str) -> None:
        """Create the time variables in a new netCDF dataset (its dimensions exist: they
        are among the layout's ``dims``)."""
        def attrs(long_name: str, **more: str) -> dict[str, str]:
            return {"standard_name": "time", "long_name": long_name, "units": units,
                    "calendar": calendar, **more}

        c = ds.createVariable(self.centered, "f8", (self.dim,))
        if self.centered == self.dim:   # CF: the coordinate variable
            c.setncatts(attrs("time", axis="T", bounds=self.centered_bounds))
        else:
            c.setncatts(attrs("Time axis", bounds=self.centered_bounds))
        ds.createVariable(self.centered_bounds, "f8", (self.dim, self.nv))
        if self.has_instant:
            ti = ds.createVariable(self.instant, "f8", (self.dim,))
            if self.instant_bounds is not None:
                ti.setncatts(attrs("time of the instant sample", bounds=self.instant_bounds))
                ds.createVariable(self.instant_bounds, "f8", (self.dim, self.nv))
            else:
                ti.setncatts(attrs("time of the instant sample"))
        if self.counter is not None:
            v = ds.createVariable(self.counter, "f8", (self.dim,))
            if self.counter_holds == "record":
                v.setncatts({"long_name": "record number", "units": "1"})
            else:
                v.setncatts(attrs("Time axis", axis="T", bounds=f"{self.counter}_bounds"))
                ds.createVariable(f"{self.counter}_bounds", "f8", (self.dim, self.nv))

    def put(self, write: Writer, idx: int, t0: float, t1: float) -> None:
        """A new record ``idx`` of the period ``(t0, t1]`` (numbers in the file's units);
        the instant time is ``t1`` until an instant field says otherwise.
        ``write(idx, name, value)`` stores one record of one time variable."""
        write(idx, self.centered, 0.5 * (t0 + t1))
        write(idx, self.centered_bounds, [t0, t1])
        if self.has_instant:
            self.put_instant(write, idx, t1)
        if self.counter is not None:
            if self.counter_holds == "record":
                write(idx, self.counter, idx + 1)
            elif self.counter_holds == "centered":
                write(idx, self.counter, 0.5 * (t0 + t1))
                write(idx, f"{self.counter}_bounds", [t0, t1])
            elif not self.has_instant:  # instant, but no instant field: the period end
                write(idx, self.counter, t1)
                write(idx, f"{self.counter}_bounds", [t1, t1])

    def put_instant(self, write: Writer, idx: int, t: float) -> None:
        """The sample time of the instant fields of record ``idx``."""
        write(idx, self.instant, t)
        if self.instant_bounds is not None:
            write(idx, self.instant_bounds, [t, t])
        if self.counter is not None and self.counter_holds == "instant":
            write(idx, self.counter, t)
            write(idx, f"{self.counter}_bounds", [t, t])


def time_axis(naming: str, counter: str, counter_name: str, has_instant: bool) -> TimeAxis:
    """The :class:`TimeAxis` of a file's ``time_naming``/``time_counter``/``time_counter_name``."""
    if naming == "cf":
        return TimeAxis("time", "nv", "time", "time_bnds", "time_instant", None, None,
                        "none", has_instant)
    return TimeAxis(counter_name, "axis_nbounds", "time_centered", "time_centered_bounds",
                    "time_instant", "time_instant_bounds",
                    None if counter == "none" else counter_name, counter, has_instant)

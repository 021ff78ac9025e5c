"""Model time for the I/O server: steps, frequencies and periods on a cftime calendar.

Models count time steps; files count calendar periods (days, months, years of a
``noleap`` or ``360_day`` calendar as often as of the Gregorian one). This module
is the one place that turns one into the other, so that the servers, the attached
mode and the field table sent to C clients agree on which step falls in which
period.

Conventions (as in XIOS):

* steps are 1-based: ``update_timestep(1)`` is the first step and its time is
  ``start + dt``; step 0 is the start itself;
* periods of a frequency ``F`` are anchored at the calendar start: period ``k``
  is ``(b_k, b_{k+1}]`` with ``b_k = start + k*F`` (calendar arithmetic for
  months and years), so a sample at time ``t`` belongs to the period with
  ``b_k < t <= b_{k+1}`` and the sample that closes a day is its last one.

Fixed durations (``ts s mi h d``) are computed in integer seconds, never in
floating point, so that "is this step on the 6-hourly grid" has an exact answer
after millions of steps.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass

import cftime

from ..config.errors import ConfigError
from .config import FREQ_RE, CalendarDef

__all__ = ["Freq", "STEP", "parse_freq", "Calendar", "format_iso"]

_SECONDS = {"s": 1, "mi": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, order=True)
class Freq:
    """A frequency: ``n`` times ``unit`` (``ts s mi h d mo y``).

    Attributes
    ----------
    n : int
        Positive count.
    unit : str
        ``ts`` (model time steps), ``s``, ``mi``, ``h``, ``d`` (fixed
        durations) or ``mo``, ``y`` (calendar months and years).
    """

    n: int
    unit: str

    @property
    def is_calendar(self) -> bool:
        """True for months and years, whose length depends on the date."""
        return self.unit in ("mo", "y")

    @property
    def months(self) -> int:
        """Length in months (``mo``/``y`` only)."""
        if not self.is_calendar:
            raise ValueError(f"{self}: not a calendar (month/year) frequency")
        return self.n * (12 if self.unit == "y" else 1)

    def __str__(self) -> str:
        return f"{self.n}{self.unit}"


#: One model time step.
STEP = Freq(1, "ts")


def parse_freq(text: str) -> Freq:
    """``"6h"`` -> ``Freq(6, "h")``; anything else is a ``ConfigError`` naming the text."""
    m = FREQ_RE.match(str(text).strip())
    if m is None:
        raise ConfigError(
            f"{text!r} is not a frequency (a count and one of ts s mi h d mo y, e.g. 6h)"
        )
    return Freq(int(m.group(1)), m.group(2))


def format_iso(t: cftime.datetime) -> str:
    """``YYYY-MM-DDThh:mm:ss`` (the field table and file-name formatting)."""
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"


_START_RE = re.compile(r"^(\d{1,4})-(\d{1,2})-(\d{1,2})(?:[ T](\d{1,2}):(\d{2})(?::(\d{2}))?)?$")


class Calendar:
    """Step <-> time <-> period conversions for one ``ioserver.calendar``.

    Parameters
    ----------
    cal : CalendarDef
        Calendar type (any cftime calendar name), start date and time step
        (a fixed duration: ``s``, ``mi``, ``h`` or ``d``).
    """

    def __init__(self, cal: CalendarDef):
        self.type = cal.type
        m = _START_RE.match(cal.start)
        if m is None:
            raise ConfigError(f"ioserver.calendar.start: {cal.start!r} is not a date")
        y, mo, d, hh, mi, ss = (int(x) if x else 0 for x in m.groups())
        try:
            self.start = cftime.datetime(y, mo, d, hh, mi, ss, calendar=cal.type)
        except ValueError as exc:
            raise ConfigError(
                f"ioserver.calendar.start: {cal.start!r} is not a {cal.type} date ({exc})"
            ) from None
        step = parse_freq(cal.timestep)
        if step.unit not in _SECONDS:
            raise ConfigError(
                f"ioserver.calendar.timestep: {cal.timestep!r} must be a fixed duration"
            )
        #: Length of one step in whole seconds.
        self.dt = step.n * _SECONDS[step.unit]

    def __repr__(self) -> str:
        return f"Calendar({self.type}, start={format_iso(self.start)}, dt={self.dt}s)"

    # ------------------------------------------------------------------ basics

    def time(self, step: int) -> cftime.datetime:
        """Time at the end of step ``step`` (1-based): ``start + step*dt``."""
        return self._plus_seconds(step * self.dt)

    def seconds_since_start(self, t: cftime.datetime) -> float:
        """Seconds from the calendar start to ``t`` (same calendar)."""
        delta = t - self.start
        return delta.days * 86400.0 + delta.seconds + delta.microseconds * 1e-6

    def _plus_seconds(self, seconds: int) -> cftime.datetime:
        days, rest = divmod(int(seconds), 86400)
        return self.start + datetime.timedelta(days=days, seconds=rest)

    def _seconds(self, freq: Freq) -> int:
        """Length of a fixed frequency in whole seconds."""
        if freq.unit == "ts":
            return freq.n * self.dt
        return freq.n * _SECONDS[freq.unit]

    def _plus_months(self, months: int) -> cftime.datetime:
        """``start`` moved by whole months; the day is clipped to the month's length."""
        s = self.start
        idx = s.month - 1 + months
        year, month = s.year + idx // 12, idx % 12 + 1
        first = cftime.datetime(year, month, 1, calendar=self.type)
        day = min(s.day, first.daysinmonth)
        return cftime.datetime(year, month, day, s.hour, s.minute, s.second, calendar=self.type)

    # ----------------------------------------------------------------- periods

    def boundary(self, freq: Freq, k: int) -> cftime.datetime:
        """``b_k = start + k*freq`` (calendar arithmetic for months and years)."""
        if freq.is_calendar:
            return self._plus_months(k * freq.months)
        return self._plus_seconds(k * self._seconds(freq))

    def bounds(self, freq: Freq, k: int) -> tuple[cftime.datetime, cftime.datetime]:
        """Period ``k`` of ``freq``: ``(b_k, b_{k+1})``, the interval ``(b_k, b_{k+1}]``."""
        return self.boundary(freq, k), self.boundary(freq, k + 1)

    def period_index(self, freq: Freq, step: int) -> int:
        """The ``k`` with ``b_k < time(step) <= b_{k+1}`` (-1 for step 0, the start)."""
        if not freq.is_calendar:
            return -((-step * self.dt) // self._seconds(freq)) - 1  # ceil(s/F) - 1
        return self.period_of(freq, self.time(step))

    def period_of(self, freq: Freq, t: cftime.datetime) -> int:
        """The ``k`` with ``b_k < t <= b_{k+1}`` for any time ``t`` (not only a step's)."""
        if not freq.is_calendar:
            us = self._seconds(freq) * 1_000_000
            d = t - self.start
            elapsed = (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
            return -(-elapsed // us) - 1
        months = (t.year - self.start.year) * 12 + (t.month - self.start.month)
        k = months // freq.months
        # The month count is exact up to the position within the month: fix it up.
        while self.boundary(freq, k) >= t:
            k -= 1
        while self.boundary(freq, k + 1) < t:
            k += 1
        return k

    def on_grid(self, freq: Freq, step: int) -> bool:
        """True when ``time(step)`` is a boundary ``b_k`` of ``freq`` (a sampling step)."""
        if not freq.is_calendar:
            return (step * self.dt) % self._seconds(freq) == 0
        return self.time(step) == self.boundary(freq, self.period_index(freq, step) + 1)

    def steps_per(self, freq: Freq) -> int | None:
        """Steps in one period of ``freq``; None for months/years or a non-multiple of dt."""
        if freq.is_calendar:
            return None
        q, r = divmod(self._seconds(freq), self.dt)
        return q if r == 0 else None

    def divides(self, fine: Freq, coarse: Freq) -> bool:
        """True when every boundary of ``coarse`` is a boundary of ``fine``.

        Both grids are anchored at the start, so this holds when ``coarse`` is a
        whole multiple of ``fine``: fixed in seconds, months in months, and a month
        grid (whole days from the start) on any fixed grid that divides a day.
        """
        if coarse.is_calendar:
            if fine.is_calendar:
                return coarse.months % fine.months == 0
            return 86400 % self._seconds(fine) == 0
        return not fine.is_calendar and self._seconds(coarse) % self._seconds(fine) == 0

    def grid_period(self, freq: Freq) -> int | None:
        """The ``p`` with ``on_grid(freq, n) == (n % p == 0)``; None for months/years.

        A fixed frequency that is not a multiple of the step (``1h`` with a 40-minute
        step) is still periodic in steps: ``p = F / gcd(F, dt)`` (here 3).
        """
        if freq.is_calendar:
            return None
        f = self._seconds(freq)
        return f // math.gcd(f, self.dt)

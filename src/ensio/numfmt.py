"""Numbers for people: fixed decimals in a bounded width, never ``-0``.

One home for how tables and log lines print numbers (``ensio report``, the
benchmarks): ``f"{-0.001:.2f}"`` is ``"-0.00"``, which reads as a sign error
to a user; these helpers print ``"0.00"`` instead. Standard library only.
"""

from __future__ import annotations

import math

__all__ = ["fixed", "fitted", "unsigned_zero"]


def unsigned_zero(text: str) -> str:
    """``text`` without the minus sign of a number that prints as zero (``-0.00`` → ``0.00``).

    Only a leading ``-`` followed by zeros, an optional point and zeros and an
    optional exponent is dropped (``-0``, ``-0.000``, ``-0.0e+00``); any
    other text is returned unchanged.
    """
    body = text[1:] if text.startswith("-") else None
    if body is None:
        return text
    mantissa = body.lower().split("e", 1)[0]
    if mantissa and set(mantissa) <= {"0", "."} and any(c == "0" for c in mantissa):
        return body
    return text


def fixed(x: float, decimals: int = 2) -> str:
    """``x`` with ``decimals`` decimals, never negative zero; ``nan`` → ``"—"``."""
    if math.isnan(x):
        return "—"
    return unsigned_zero(f"{x:.{decimals}f}")


def fitted(x: float, width: int, decimals: int = 2) -> str:
    """:func:`fixed` if it fits in ``width`` characters, else 3 significant digits (``1.23e+07``).

    ``width`` must be at least 10 so that every finite float fits (``-1.23e+300``).
    """
    if width < 10:
        raise ValueError(f"width must be at least 10, got {width}")
    text = fixed(x, decimals)
    if len(text) <= width:
        return text
    return unsigned_zero(f"{x:.2e}")

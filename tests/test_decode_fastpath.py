"""Encoding.decode without a mask when no value can be missing: same values, honest flag."""

from __future__ import annotations

import numpy as np
import pytest

from ensio.layout.encoding import Encoding


def _reference(raw: np.ndarray, fill: float | None, vmin: float | None, vmax: float | None,
               scale: float | None) -> np.ndarray:  # fmt: skip
    """Physical values computed independently: NaN where not finite, fill, or out of range."""
    x = raw.astype(np.float64)
    bad = ~np.isfinite(x)
    if fill is not None:
        bad |= x == fill
    if vmin is not None:
        bad |= x < vmin
    if vmax is not None:
        bad |= x > vmax
    y = x * scale if scale is not None else x.copy()
    y[bad] = np.nan
    return y


@pytest.mark.parametrize("dtype", ["f8", ">f8", "f4"])
@pytest.mark.parametrize("spoil", [None, "nan", "inf", "fill", "below", "above"])
@pytest.mark.parametrize("scale", [None, 0.5])
def test_decode_equals_the_masked_reference(rng, dtype, spoil, scale):
    raw = rng.normal(size=500).astype(dtype)
    fill = -999.0
    attrs = {"_FillValue": np.array([fill], dtype=dtype), "valid_min": -50.0, "valid_max": 50.0}
    if scale is not None:
        attrs["scale_factor"] = scale
    enc = Encoding.from_attributes(np.dtype(dtype), attrs)
    at = int(rng.integers(raw.size))
    raw[at] = {None: raw[at], "nan": np.nan, "inf": np.inf, "fill": fill, "below": -60.0,
               "above": 60.0}[spoil]  # fmt: skip
    out = np.empty(raw.size)
    flag = enc.decode(raw, out)
    ref = _reference(raw, fill, -50.0, 50.0, scale)
    np.testing.assert_array_equal(out, ref)  # NaN positions equal too
    if not flag:
        assert np.isfinite(out).all()
    assert flag is (spoil is not None or scale is not None)


def test_decode_in_place_native_float64(rng):
    raw = rng.normal(size=300)
    enc = Encoding.from_attributes(np.dtype("f8"), {})
    expect = raw.copy()
    assert enc.decode(raw, raw) is False
    np.testing.assert_array_equal(raw, expect)
    raw[7] = enc.fill  # the default fill of float64 means missing
    assert enc.decode(raw, raw) is True
    assert np.isnan(raw[7]) and np.isfinite(np.delete(raw, 7)).all()

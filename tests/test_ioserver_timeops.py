"""Time-operation accumulators against numpy's nan-reductions on random series."""

import warnings

import numpy as np
import pytest

from ensio.ioserver.timeops import ACCUMULATORS, CELL_METHODS, Accumulator

OPERATIONS = ("instant", "average", "minimum", "maximum", "accumulate", "once")


def _series(rng: np.random.Generator, steps: int, shape=(4, 5), p_missing=0.3) -> np.ndarray:
    """(steps, *shape) random values with random NaNs; point (0, 0) is always missing."""
    data = rng.normal(280.0, 15.0, size=(steps, *shape))
    data[rng.random(data.shape) < p_missing] = np.nan
    data[:, 0, 0] = np.nan
    return data


def _expected(op: str, series: np.ndarray) -> np.ndarray:
    """The reduction over axis 0 computed by numpy alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # all-NaN slices
        none_valid = np.all(np.isnan(series), axis=0)
        return {
            "instant": lambda: series[-1],
            "once": lambda: series[0],
            "average": lambda: np.nanmean(series, axis=0),
            "minimum": lambda: np.nanmin(series, axis=0),
            "maximum": lambda: np.nanmax(series, axis=0),
            "accumulate": lambda: np.where(none_valid, np.nan, np.nansum(series, axis=0)),
        }[op]()


def _run(op: str, series: np.ndarray) -> Accumulator:
    acc = ACCUMULATORS[op](series.shape[1:])
    for sample in series:
        acc.add(sample)
    return acc


def test_tables_name_every_operation():
    assert set(ACCUMULATORS) == set(OPERATIONS)
    assert CELL_METHODS == {"instant": "point", "average": "mean", "minimum": "minimum",
                            "maximum": "maximum", "accumulate": "sum", "once": "point"}


@pytest.mark.parametrize("op", OPERATIONS)
def test_matches_numpy_on_random_series(op, rng):
    for steps in (1, 2, int(rng.integers(3, 40))):
        series = _series(rng, steps)
        acc = _run(op, series)
        assert acc.count == steps
        got = acc.result()
        assert got.dtype == np.float64 and got.shape == series.shape[1:]
        np.testing.assert_allclose(got, _expected(op, series), rtol=1e-13, atol=0,
                                   equal_nan=True)
        assert np.isnan(got[0, 0])                            # never a valid sample


@pytest.mark.parametrize("op", OPERATIONS)
def test_3d_field_and_all_missing_samples(op, rng):
    series = _series(rng, 7, shape=(3, 4, 5), p_missing=0.5)
    series[2] = np.nan                                        # a wholly missing step
    np.testing.assert_allclose(_run(op, series).result(), _expected(op, series),
                               rtol=1e-13, atol=0, equal_nan=True)


@pytest.mark.parametrize("op", OPERATIONS)
def test_no_sample_gives_missing(op):
    acc = ACCUMULATORS[op]((2, 3))
    assert acc.count == 0
    assert np.isnan(acc.result()).all() and acc.result().shape == (2, 3)


@pytest.mark.parametrize("op", OPERATIONS)
def test_state_is_independent_of_inputs_and_results(op, rng):
    series = _series(rng, 5, p_missing=0.0)
    expected = _expected(op, series).copy()
    acc = ACCUMULATORS[op](series.shape[1:])
    for sample in series:
        acc.add(sample)
        sample[...] = -1e30                                   # the caller reuses its buffer
    first = acc.result()
    first[...] = 0.0
    np.testing.assert_allclose(acc.result(), expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize("op", OPERATIONS)
def test_wrong_shape_is_refused(op):
    acc = ACCUMULATORS[op]((4, 5))
    with pytest.raises(ValueError, match=r"shape \(5, 4\), expected \(4, 5\)"):
        acc.add(np.zeros((5, 4)))
    assert acc.count == 0


@pytest.mark.parametrize("op", OPERATIONS)
def test_other_dtypes_are_converted(op, rng):
    ints = rng.integers(-50, 50, size=(6, 3, 2))
    np.testing.assert_allclose(_run(op, ints.astype(np.float32)).result(),
                               _expected(op, ints.astype(np.float64)), rtol=1e-13)
    np.testing.assert_allclose(_run(op, ints).result(),
                               _expected(op, ints.astype(np.float64)), rtol=1e-13)


def test_infinite_samples_are_values(rng):
    series = _series(rng, 6, p_missing=0.2)
    series[3, 1, 1], series[4, 2, 2] = np.inf, -np.inf
    for op in OPERATIONS:
        np.testing.assert_allclose(_run(op, series).result(), _expected(op, series),
                                   rtol=1e-13, atol=0, equal_nan=True)


def test_state_is_minimal():
    assert ACCUMULATORS["average"]((10, 20)).nbytes == 200 * (8 + 4)   # float64 sum, int32 count
    assert ACCUMULATORS["maximum"]((10, 20)).nbytes == 200 * 8
    assert ACCUMULATORS["minimum"]((10, 20)).nbytes == 200 * 8
    assert ACCUMULATORS["accumulate"]((10, 20)).nbytes == 200 * (8 + 1)
    once = ACCUMULATORS["once"]((10, 20))
    assert once.nbytes == 0
    once.add(np.ones((10, 20)))
    assert once.nbytes == 200 * 8


def test_chained_monthly_mean_of_daily_maxima(rng):
    """Maximum per day, then the average of those maxima (an ``@`` chain, seed 002)."""
    days, per_day = 30, 24
    series = _series(rng, days * per_day, shape=(3, 4), p_missing=0.4)
    series[5 * per_day:6 * per_day, 1, 1] = np.nan            # day 6 wholly missing there
    monthly = ACCUMULATORS["average"]((3, 4))
    for day in range(days):
        daily = _run("maximum", series[day * per_day:(day + 1) * per_day])
        monthly.add(daily.result())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanmean(np.nanmax(series.reshape(days, per_day, 3, 4), axis=1), axis=0)
    np.testing.assert_allclose(monthly.result(), expected, rtol=1e-13, atol=0, equal_nan=True)
    assert monthly.count == days

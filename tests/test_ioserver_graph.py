"""ioserver post-processing graph against independent numpy computations on random series.

Every expected value below is computed with numpy from the same random series
(with NaNs) the graph is fed, never by the graph or the accumulators themselves.
"""

import warnings

import numpy as np
import pytest

from ensio.config.errors import ConfigError
from ensio.ioserver.configload import ioserver_from_dict
from ensio.ioserver.graph import Graph

SHAPE = (3, 4)


def make_cfg(files, fields, *, calendar=None, extra_fields=()):
    raw = {
        "calendar": calendar or {"type": "noleap", "start": "2000-01-01 00:00:00",
                                 "timestep": "6h"},
        "domains": [{"id": "d", "type": "rectilinear", "ni_glo": SHAPE[1], "nj_glo": SHAPE[0]}],
        "axes": [{"id": "lev", "n": 2}],
        "grids": [{"id": "g", "domain": "d"}, {"id": "g3", "domain": "d", "axis": "lev"}],
        "field_groups": [{"id": "grp", "grid": "g", "operation": "average",
                          "fields": [{"id": "tas"}, {"id": "pr"}, *fields]}],
        "fields": list(extra_fields),
        "files": files,
    }
    return ioserver_from_dict(raw)


def series(rng, nsteps, shape=SHAPE, nan=0.2):
    """Random samples for steps 1..nsteps (index n-1), a fraction NaN, one point always NaN."""
    s = rng.normal(280.0, 10.0, size=(nsteps, *shape))
    s[rng.random(s.shape) < nan] = np.nan
    s[(slice(None),) + (0,) * len(shape)] = np.nan
    return s


def reduce(op, a, axis):
    """Independent reference of a time operation (NaN = missing sample)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if op == "average":
            return np.nanmean(a, axis=axis)
        if op == "minimum":
            return np.nanmin(a, axis=axis)
        if op == "maximum":
            return np.nanmax(a, axis=axis)
        if op == "accumulate":
            return np.where(np.isnan(a).all(axis=axis), np.nan, np.nansum(a, axis=axis))
        if op == "instant":
            return np.take(a, -1, axis=axis)
    raise AssertionError(op)


def blocks(a, n):
    """(nsteps, ...) -> (nsteps // n, n, ...): consecutive periods of n samples."""
    return a[: len(a) // n * n].reshape(len(a) // n, n, *a.shape[1:])


def run(cfg, data, nsteps, *, files=None, points=None, part=(), push_if=None, every=1):
    """Feed steps 1..nsteps (every field, or those ``push_if(graph, id, step)`` accepts)."""
    g = Graph(cfg, files=files, points=points)
    out = []
    for n in range(1, nsteps + 1):
        for fid, s in data.items():
            if push_if is None or push_if(g, fid, n):
                g.push(fid, n, s[n - 1][part])
        if n % every == 0:
            out += g.advance(n)
    return out + g.finish(nsteps)


def by_name(records):
    out = {}
    for r in records:
        out.setdefault(r.field.name, []).append(r)
    return out


def assert_series(records, expected):
    assert [r.period for r in records] == list(range(len(expected)))
    np.testing.assert_allclose(np.stack([r.data for r in records]), expected, rtol=1e-12)


@pytest.mark.parametrize("op", ["average", "minimum", "maximum", "accumulate", "instant"])
def test_each_operation_daily(rng, op):
    cfg = make_cfg([{"id": "f", "name": "f", "output_freq": "1d",
                     "fields": [{"field_ref": "tas", "operation": op}]}], [])
    s = series(rng, 4 * 5)
    recs = run(cfg, {"tas": s, "pr": s}, 4 * 5)
    assert_series(recs, reduce(op, blocks(s, 4), 1))
    r = recs[1]
    assert (r.t0.day, r.t1.day) == (2, 3)
    assert (r.t_instant == r.t1) if op == "instant" else r.t_instant is None
    assert np.isnan(r.data[0, 0])  # a point with no valid sample is missing


def test_once_and_freq_op_subsampling(rng):
    cfg = make_cfg([{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"field_ref": "tas", "name": "first", "operation": "once"},
        {"field_ref": "tas", "name": "avg12h", "freq_op": "12h"},
        {"field_ref": "tas", "name": "max2ts", "operation": "maximum", "freq_op": "2ts"},
        {"field_ref": "tas", "name": "inst12h", "operation": "instant", "freq_op": "12h"},
    ]}], [])
    s = series(rng, 4 * 6)
    got = by_name(run(cfg, {"tas": s, "pr": s}, 4 * 6))
    assert len(got["first"]) == 1 and got["first"][0].period == 0
    np.testing.assert_array_equal(got["first"][0].data, s[0])
    assert got["first"][0].t_instant == Graph(cfg).calendar.time(1)
    every2 = s[1::2]  # steps 2, 4, 6, ...: the 12-hourly samples
    assert_series(got["avg12h"], reduce("average", blocks(every2, 2), 1))
    assert_series(got["max2ts"], reduce("maximum", blocks(every2, 2), 1))
    assert_series(got["inst12h"], s[3::4])


def test_seed_monthly_mean_of_daily_min_max_mean(rng):
    """Seed 002: monthly mean of daily min/max/mean, noleap, dt = 6h, January and February."""
    fields = [{"id": "tas_min", "field_ref": "tas", "operation": "minimum"},
              {"id": "tas_max", "field_ref": "tas", "operation": "maximum"}]
    cfg = make_cfg([{"id": "m", "name": "m", "output_freq": "1mo", "fields": [
        {"field_ref": "tas_min", "name": "ave_daily_min", "operation": "average",
         "freq_op": "1d", "expr": "@tas_min"},
        {"name": "ave_daily_max", "operation": "average", "freq_op": "1d", "expr": "@tas_max"},
        {"name": "ave_daily_ave", "operation": "average", "freq_op": "1d", "expr": "@tas"},
        {"name": "max_daily_range", "operation": "maximum", "freq_op": "1d",
         "expr": "@tas_max - @tas_min"},
    ]}], fields)
    nsteps = 4 * 59
    s = series(rng, nsteps)
    got = by_name(run(cfg, {"tas": s, "pr": s}, nsteps))
    days = blocks(s, 4)
    month = [slice(0, 31), slice(31, 59)]
    for name, op in (("ave_daily_min", "minimum"), ("ave_daily_max", "maximum"),
                     ("ave_daily_ave", "average")):
        daily = reduce(op, days, 1)
        assert_series(got[name], np.stack([reduce("average", daily[m], 0) for m in month]))
    rng_daily = reduce("maximum", days, 1) - reduce("minimum", days, 1)
    assert_series(got["max_daily_range"],
                  np.stack([reduce("maximum", rng_daily[m], 0) for m in month]))
    r = got["ave_daily_max"][1]
    assert (r.t0.month, r.t0.day, r.t1.month, r.t1.day) == (2, 1, 3, 1)


def test_nested_at_chain_and_instant_refs(rng):
    """@ of a field that is itself an @ expression; @ mixed with an instant reference."""
    fields = [{"id": "tas_max", "field_ref": "tas", "operation": "maximum"},
              {"id": "dmax", "expr": "@tas_max", "freq_op": "1d", "operation": "average"},
              {"id": "max12", "field_ref": "tas", "operation": "maximum", "freq_op": "12h"}]
    cfg = make_cfg([{"id": "f", "name": "f", "output_freq": "10d", "fields": [
        {"name": "max5d_of_mean_dmax", "expr": "@dmax", "freq_op": "5d",
         "operation": "maximum"},
        {"name": "excess", "expr": "@tas_max - tas", "freq_op": "1d", "operation": "average"},
        {"field_ref": "dmax", "name": "dmax_acc", "operation": "accumulate"},
        # X's own freq_op samples X for @X (as XIOS): the daily max of the 12-hourly values
        {"name": "max_of_12h", "expr": "@max12", "freq_op": "1d", "operation": "instant"},
    ]}], fields)
    nsteps = 4 * 20
    s = series(rng, nsteps)
    got = by_name(run(cfg, {"tas": s, "pr": s}, nsteps))
    dmax = reduce("maximum", blocks(s, 4), 1)                     # (20, ...)
    five = reduce("average", blocks(dmax, 5), 1)                  # (4, ...)
    assert_series(got["max5d_of_mean_dmax"], reduce("maximum", blocks(five, 2), 1))
    excess = dmax - s[3::4]                                        # tas at the day's end
    assert_series(got["excess"], reduce("average", blocks(excess, 10), 1))
    assert_series(got["dmax_acc"], reduce("accumulate", blocks(dmax, 10), 1))
    max12 = reduce("maximum", blocks(s[1::2], 2), 1)               # steps 2, 4 of each day
    assert_series(got["max_of_12h"], max12[9::10])


def test_expressions_every_step(rng):
    cfg = make_cfg([{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"name": "combo", "expr": "(tas - 273.15) * 2 + pr / 10", "operation": "average"},
        {"name": "pos", "expr": "tas > 280 ? tas - 280 : 0", "operation": "accumulate"},
        {"name": "kelvin", "field_ref": "tas", "expr": "tas - 273.15", "operation": "maximum"},
        {"name": "const", "expr": "2 ^ 3", "grid": "g", "operation": "average"},
    ]}], [])
    s, p = series(rng, 12), series(rng, 12)
    got = by_name(run(cfg, {"tas": s, "pr": p}, 12))
    assert_series(got["combo"], reduce("average", blocks((s - 273.15) * 2 + p / 10, 4), 1))
    with np.errstate(invalid="ignore"):
        pos = np.where(np.isnan(s), np.nan, np.where(s > 280, s - 280, 0.0))
    assert_series(got["pos"], reduce("accumulate", blocks(pos, 4), 1))
    assert_series(got["kelvin"], reduce("maximum", blocks(s - 273.15, 4), 1))
    assert_series(got["const"], np.full((3, *SHAPE), 8.0))


@pytest.mark.parametrize("calendar,lengths", [("noleap", [31, 28, 31]),
                                              ("360_day", [30, 30, 30]),
                                              ("standard", [31, 29, 31])])
def test_month_periods(rng, calendar, lengths):
    cfg = make_cfg([{"id": "f", "name": "f", "output_freq": "1mo", "fields": [
        {"field_ref": "pr", "operation": "accumulate"}]}], [],
        calendar={"type": calendar, "start": "2000-01-01", "timestep": "1d"})
    nsteps = sum(lengths) + 10  # and a partial fourth month finish() must not emit
    s = series(rng, nsteps, nan=0.1)
    recs = run(cfg, {"tas": s, "pr": s}, nsteps)
    edges = np.cumsum([0, *lengths])
    assert_series(recs, np.stack([reduce("accumulate", s[a:b], 0)
                                  for a, b in zip(edges[:-1], edges[1:], strict=True)]))
    assert [(r.t0.month, r.t1.month) for r in recs] == [(1, 2), (2, 3), (3, 4)]


def test_partial_period_not_emitted_and_bursty_advance(rng):
    cfg = make_cfg([{"id": "a", "name": "a", "output_freq": "1d",
                     "fields": [{"field_ref": "tas"}]},
                    {"id": "b", "name": "b", "output_freq": "12h",
                     "fields": [{"field_ref": "pr", "operation": "maximum"},
                                {"field_ref": "tas", "operation": "instant"}]}], [])
    s, p = series(rng, 11), series(rng, 11)
    steady = run(cfg, {"tas": s, "pr": p}, 11)
    assert [(r.file_id, r.field.name, r.period) for r in steady] == [
        ("b", "pr", 0), ("b", "tas", 0),                    # advance(2)
        ("a", "tas", 0), ("b", "pr", 1), ("b", "tas", 1),   # advance(4)
        ("b", "pr", 2), ("b", "tas", 2),
        ("a", "tas", 1), ("b", "pr", 3), ("b", "tas", 3),
        ("b", "pr", 4), ("b", "tas", 4)]                    # step 11: day 3 is partial
    bursty = run(cfg, {"tas": s, "pr": p}, 11, every=5)
    key = sorted((r.file_id, r.field.name, r.period) for r in bursty)
    assert key == sorted((r.file_id, r.field.name, r.period) for r in steady)
    # within one advance: file order, field order, then period
    g = Graph(cfg)
    for n in range(1, 9):
        g.push("tas", n, s[n - 1])
        g.push("pr", n, p[n - 1])
    assert [(r.file_id, r.field.name, r.period) for r in g.advance(8)] == [
        ("a", "tas", 0), ("a", "tas", 1), ("b", "pr", 0), ("b", "pr", 1), ("b", "pr", 2),
        ("b", "pr", 3), ("b", "tas", 0), ("b", "tas", 1), ("b", "tas", 2), ("b", "tas", 3)]


def test_missing_value_of_source(rng):
    extra = [{"id": "sst", "grid": "g", "missing_value": 1e20, "operation": "average"}]
    cfg = make_cfg([{"id": "f", "name": "f", "output_freq": "1d",
                     "fields": [{"field_ref": "sst"},
                                {"name": "d", "expr": "sst - 1", "operation": "average"}]}],
                   [], extra_fields=extra)
    s = series(rng, 8, nan=0.0).astype(np.float32)
    s[rng.random(s.shape) < 0.3] = np.float32(1e20)
    recs = by_name(run(cfg, {"sst": s}, 8))
    ref = np.where(s == np.float32(1e20), np.nan, s.astype(np.float64))
    assert_series(recs["sst"], reduce("average", blocks(ref, 4), 1))
    assert_series(recs["d"], reduce("average", blocks(ref - 1, 4), 1))


def test_part_of_the_points_is_the_slice_of_the_full_graph(rng):
    """Attached mode: a rank's part gives exactly the slice of the global records."""
    fields = [{"id": "tas_max", "field_ref": "tas", "operation": "maximum"},
              {"id": "ta", "grid": "g3"}]
    cfg = make_cfg([{"id": "f", "name": "f", "output_freq": "1d", "fields": [
        {"name": "dmax", "expr": "@tas_max * 2 - tas", "freq_op": "12h"},
        {"field_ref": "ta", "operation": "minimum"}, {"field_ref": "pr", "operation": "once"}]}],
        fields)
    data = {"tas": series(rng, 12), "pr": series(rng, 12), "ta": series(rng, 12, (2, *SHAPE))}
    full = run(cfg, data, 12)
    part2 = (slice(1, 3), slice(1, 4))
    points = {"g": (2, 3), "g3": (2, 2, 3)}
    g = Graph(cfg, points=points)
    local = []
    for n in range(1, 13):
        for fid, s in data.items():
            g.push(fid, n, s[n - 1][(slice(None), *part2) if fid == "ta" else part2])
        local += g.advance(n)
    local += g.finish(12)
    assert [(r.field.name, r.period) for r in local] == [(r.field.name, r.period) for r in full]
    for a, b in zip(full, local, strict=True):
        want = a.data[:, part2[0], part2[1]] if a.field.name == "ta" else a.data[part2]
        np.testing.assert_array_equal(b.data, want)


def test_needs_and_period_steps(rng):
    fields = [{"id": "u"}, {"id": "v"}, {"id": "w"}, {"id": "x"}, {"id": "y"}, {"id": "unused"},
              {"id": "dy", "expr": "@wmax - y", "freq_op": "1d"},
              {"id": "q"}, {"id": "r"}, {"id": "rlast", "field_ref": "r", "operation": "instant"},
              {"id": "wmax", "field_ref": "w", "operation": "maximum", "freq_op": "2ts"}]
    cfg = make_cfg([
        {"id": "a", "name": "a", "output_freq": "1d", "fields": [
            {"field_ref": "u", "freq_op": "12h"}, {"field_ref": "v", "freq_op": "12h"},
            {"name": "w6", "expr": "@wmax", "freq_op": "18h"},
            {"name": "wx", "expr": "@wmax - x", "freq_op": "1d"},
            {"field_ref": "dy", "name": "dy_each_step", "freq_op": "1ts"},
            {"field_ref": "q", "operation": "instant"},
            {"name": "r2", "expr": "@rlast * 2", "freq_op": "12h"}]},
        {"id": "b", "name": "b", "output_freq": "1d", "fields": [
            {"field_ref": "v", "name": "v18", "freq_op": "18h"},
            {"field_ref": "tas", "operation": "instant", "freq_op": "1mo"}]},
        {"id": "off", "name": "off", "output_freq": "1d", "enabled": False,
         "fields": [{"field_ref": "pr"}]},
    ], fields, calendar={"type": "noleap", "start": "2000-01-01", "timestep": "6h"})
    g = Graph(cfg)
    sources = ("u", "v", "w", "x", "y", "q", "r", "tas", "pr", "unused")
    assert g.period_steps("u") == (2,)
    assert g.period_steps("v") == (2, 3)
    assert g.period_steps("w") == (2,)
    assert g.period_steps("x") == (4,)  # read at the end of the @ periods only
    assert g.period_steps("y") == (4,)  # ... even when the consumer samples every step
    assert g.period_steps("q") == (4,)  # instant keeps the sample at the period's end only
    assert g.period_steps("r") == (2,)  # ... also under @
    assert g.period_steps("unused") == () and g.period_steps("pr") == ()
    assert g.period_steps("tas") == (4,)  # a month grid: its days stand for it
    for n in range(1, 4 * 70):
        for fid in sources:
            periods = g.period_steps(fid)
            if g.needs(fid, n):
                assert any(n % p == 0 for p in periods), (fid, n)
            if fid != "tas":
                assert g.needs(fid, n) == any(n % p == 0 for p in periods), (fid, n)
        assert g.needs("tas", n) == (n in (4 * 31, 4 * 59))
    # pushing only what is needed loses nothing
    data = {f: series(rng, 4 * 62) for f in sources}
    full = run(cfg, data, 4 * 62)
    assert len(full) > 0
    lean = run(cfg, data, 4 * 62, push_if=lambda g, f, n: g.needs(f, n))
    table = run(cfg, data, 4 * 62,  # what a client does with the field table
                push_if=lambda g, f, n: any(n % p == 0 for p in g.period_steps(f)))
    for a, b, c in zip(full, lean, table, strict=True):
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_array_equal(a.data, c.data)


def test_files_subset_and_disabled_fields(rng):
    cfg = make_cfg([{"id": "a", "name": "a", "output_freq": "1d", "fields": [
                        {"field_ref": "tas"}, {"field_ref": "pr", "enabled": False}]},
                    {"id": "b", "name": "b", "output_freq": "1d", "fields": [
                        {"field_ref": "pr"}]}], [])
    s = series(rng, 4)
    assert {(r.file_id, r.field.name) for r in run(cfg, {"tas": s, "pr": s}, 4)} == {
        ("a", "tas"), ("b", "pr")}
    assert {r.file_id for r in run(cfg, {"tas": s, "pr": s}, 4, files=["b"])} == {"b"}
    assert Graph(cfg, files=["a"]).period_steps("pr") == ()
    with pytest.raises(ConfigError, match="'zz'"):
        Graph(cfg, files=["zz"])


def test_memory_stays_bounded(rng):
    fields = [{"id": "tas_max", "field_ref": "tas", "operation": "maximum"}]
    cfg = make_cfg([{"id": "a", "name": "a", "output_freq": "1mo", "fields": [
        {"name": "m", "expr": "@tas_max", "freq_op": "1d"}, {"field_ref": "pr"},
        # 5-hourly periods with a 6-hour step: only every fifth one ends on a step
        {"name": "odd", "expr": "@tas_max", "freq_op": "5h"}]}], fields)
    g = Graph(cfg)
    x = np.ones(SHAPE)
    held = []
    for n in range(1, 4 * 365 + 1):
        g.push("tas", n, x)
        g.push("pr", n, x)
        g.advance(n)
        held.append(g.nbytes)
    assert max(held) == max(held[: 4 * 31])  # a year holds no more than the first month
    assert g.nbytes <= 4 * x.nbytes * 4
    assert g.finish(4 * 365) == [] and g.nbytes == 0


def test_errors_name_field_and_step():
    cfg = make_cfg([{"id": "a", "name": "a", "output_freq": "1d", "fields": [
        {"field_ref": "tas"}, {"name": "c", "expr": "tas * 2"}]}],
        [{"id": "t2", "field_ref": "tas"}])
    g = Graph(cfg)
    with pytest.raises(ValueError, match="unknown field 'nope'"):
        g.push("nope", 1, np.zeros(SHAPE))
    with pytest.raises(ValueError, match="'t2' is computed"):
        g.push("t2", 1, np.zeros(SHAPE))
    with pytest.raises(ValueError, match=r"'tas' step 1: shape \(4, 3\), expected \(3, 4\)"):
        g.push("tas", 1, np.zeros((4, 3)))
    g.push("tas", 1, np.zeros(SHAPE))
    with pytest.raises(ValueError, match="'tas' step 1 pushed twice"):
        g.push("tas", 1, np.zeros(SHAPE))
    assert len(g.advance(4)) == 2 and g.advance(2) == [] and g.advance(4) == []
    with pytest.raises(ValueError, match="'tas' step 2: steps up to 4"):
        g.push("tas", 2, np.zeros(SHAPE))
    with pytest.raises(ValueError, match="unknown field"):
        g.needs("nope", 1)
    with pytest.raises(ConfigError, match="no point shape given for grid 'g'"):
        Graph(cfg, points={"g3": (2, 1, 1)})
    with pytest.raises(ConfigError, match=r"files\.a\.fields\.c\.expr: expression"):
        make_cfg([{"id": "a", "name": "a", "output_freq": "1d", "fields": [
            {"name": "c", "expr": "tas * * 2"}]}], [])  # refused when the config is loaded


def test_first_step_of_a_restarted_run(rng):
    cfg = make_cfg([{"id": "a", "name": "a", "output_freq": "1d", "fields": [
        {"field_ref": "tas"}, {"field_ref": "pr", "operation": "once"}]}], [])
    s = series(rng, 40)
    g = Graph(cfg, first_step=23)  # the run restarts in day 6 (steps 21..24)
    recs = []
    for n in range(23, 41):
        g.push("tas", n, s[n - 1])
        g.push("pr", n, s[n - 1])
        recs += g.advance(n)
    got = by_name(recs + g.finish(40))
    assert [r.period for r in got["tas"]] == [5, 6, 7, 8, 9]
    first = reduce("average", s[22:24], 0)  # day 6 from the restart on
    np.testing.assert_allclose(np.stack([r.data for r in got["tas"]]),
                               [first, *reduce("average", blocks(s[24:40], 4), 1)], rtol=1e-12)
    np.testing.assert_array_equal(got["pr"][0].data, s[22])
    with pytest.raises(ValueError, match="first_step"):
        Graph(cfg, first_step=0)

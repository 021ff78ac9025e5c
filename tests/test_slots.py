"""Time slots of a 4-D analysis: config keys, binning, observation times, bad input."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest
from mpi4py import MPI

from ensio.analysis.stoo import observe_slots, pair_range
from ensio.config import config_from_dict
from ensio.config.analysis import AnalysisSection, slot_edges
from ensio.config.errors import ConfigError
from ensio.config.load import from_plain
from ensio.errors import InputError
from ensio.models.moving import config_text, write_moving, write_state
from ensio.obs import ObsBatch, read_obs_netcdf
from ensio.obs.operators import ObsOperator
from ensio.obs.qc import quality_control
from ensio.obs.slots import apply_at_rows, assign_slots
from ensio.offline import run_analysis


def _analysis(**kw) -> AnalysisSection:
    return from_plain(AnalysisSection, {"filter": "etkf", **kw}, "analysis")


# ---------------------------------------------------------------- config


def test_time_slots_count_splits_the_window_evenly():
    a = _analysis(time_slots=4, window=[-3, 3])
    assert a.n_slots == 4
    assert a.edges == (-3.0, -1.5, 0.0, 1.5, 3.0)


def test_time_slots_edges_are_the_window():
    a = _analysis(time_slots=[-3, -1, 0, 3])
    assert a.n_slots == 3 and a.edges == (-3.0, -1.0, 0.0, 3.0)


def test_one_slot_without_window_uses_no_time():
    a = _analysis(time_slots=1)
    assert a.n_slots == 1 and a.edges is None
    assert _analysis().n_slots == 1 and _analysis().edges is None
    assert slot_edges(1, (0.0, 6.0)) == (0.0, 6.0)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"time_slots": 0}, "analysis.time_slots: must be at least 1"),
        ({"time_slots": 3}, "analysis.time_slots: 3 slots split analysis.window"),
        ({"time_slots": [0, 0, 1]}, "analysis.time_slots: slot edges must increase"),
        ({"time_slots": [1.5]}, "analysis.time_slots: slot edges must be at least two"),
        ({"time_slots": [0, 1], "window": [0, 1]}, "analysis.window: the slot edges"),
        ({"time_slots": 2, "window": [3, 1]}, "analysis.window: start must be before end"),
        ({"time_slots": 2, "window": [0, 1, 2]}, "analysis.window: expected [start, end]"),
        ({"window": [0, 1]}, "analysis.window: only used with analysis.time_slots"),
        ({"time_slots": "many"}, "analysis.time_slots"),
    ],
)
def test_bad_time_slots_name_the_key(kw, message):
    with pytest.raises(ConfigError) as err:
        _analysis(**kw)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def _raw(**ens) -> dict:
    return {
        "ensemble": {"members": "m{member}.nc", "size": 2, "variables": ["state"], **ens},
        "analysis": {"filter": "etkf", "time_slots": 3, "window": [0, 3]},
    }


def test_several_slots_need_the_slot_pattern():
    with pytest.raises(ConfigError, match=r"^ensemble\.slots: required for analysis\.time_slots"):
        config_from_dict(_raw())
    cfg = config_from_dict(_raw(slots="fc/m{member}_{slot}.nc"), base_dir="/x")
    assert str(cfg.ensemble.slot_path(2, 3, cfg.base_dir)) == "/x/fc/m2_3.nc"


def test_slot_pattern_needs_both_placeholders():
    with pytest.raises(ConfigError, match=r"^ensemble\.slots: pattern .* \{member\} and \{slot\}"):
        config_from_dict(_raw(slots="fc/m{member}.nc"))


# ---------------------------------------------------------------- binning


def test_assign_slots_half_open_with_closed_end():
    edges = (0.0, 1.0, 2.0, 4.0)
    t = np.array([-0.1, 0.0, 0.999, 1.0, 2.5, 4.0, 4.01, np.nan])
    slot, inside = assign_slots(t, edges, t.size)
    assert slot.tolist() == [-1, 0, 0, 1, 2, 2, -1, -1]
    assert inside.tolist() == [False, True, True, True, True, True, False, False]


def test_assign_slots_without_edges_puts_everything_in_one_slot():
    slot, inside = assign_slots(None, None, 3)
    assert slot.tolist() == [0, 0, 0] and inside.all()


def test_apply_at_rows_is_the_weighted_sum(rng):
    """Zero-weight entries read nothing: a NaN there does not spoil the observation."""
    x = rng.normal(size=50)
    rows = rng.integers(0, 49, size=(7, 4))
    w = rng.uniform(0.1, 1.0, size=(7, 4))
    rows[2, 3], w[2, 3], x[49] = 49, 0.0, np.nan
    need = np.unique(rows)
    got = apply_at_rows(ObsOperator(rows, w), need, x[need])
    expect = [sum(w[i, p] * x[rows[i, p]] for p in range(4) if w[i, p]) for i in range(7)]
    # rounding of a sum is relative to the sum of the magnitudes, not to the sum itself
    # (four terms that nearly cancel): a few ulps of that
    scale = [sum(abs(w[i, p] * x[rows[i, p]]) for p in range(4) if w[i, p]) for i in range(7)]
    assert np.all(np.abs(np.asarray(got) - expect) <= 8 * np.finfo(float).eps * np.array(scale))


def test_pairs_cover_members_and_slots_once():
    for size in (1, 2, 3, 5, 7, 13):
        got = sorted(p for r in range(size) for p in pair_range(4, 3, size, r))
        assert got == list(range(12))


def test_observe_slots_reads_each_pair_at_its_slot():
    """Member j at slot s reads j*100 + s*10 + row: the value tells which state was read."""
    n = 20
    obs = ObsBatch(values=np.zeros(6), errors=np.ones(6), lon=np.zeros(6), lat=np.zeros(6),
                   index=np.array([0, 5, 7, 3, 19, 2]))
    slot = np.array([0, 1, 2, 1, -1, 0])
    calls = []

    def reader(j, s, rows):
        calls.append((j, s))
        return j * 100.0 + s * 10.0 + rows

    held = observe_slots(obs, slot, range(2, 7), 3, n, None, reader)  # pairs (0,2)..(2,0)
    assert sorted(calls) == [(0, 2), (1, 0), (1, 1), (1, 2), (2, 0)]
    expect = np.array([
        [0, 0, 27, 0, 0, 0],       # member 0: slot 2 only
        [100, 115, 127, 113, 0, 102],
        [200, 0, 0, 0, 0, 202],    # member 2: slot 0 only
    ], dtype=float)  # fmt: skip
    np.testing.assert_array_equal(held, expect)


# ---------------------------------------------------------------- observation files


def _obs_file(path, n=4, time=True):
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", n)
        cols = {"lon": np.arange(n) * 10.0, "lat": np.zeros(n), "value": np.ones(n),
                "error": np.ones(n), "index": np.arange(n)}
        if time:
            cols["time"] = np.linspace(-3, 3, n)
        for k, v in cols.items():
            ds.createVariable(k, "i8" if k == "index" else "f8", ("obs",))[:] = v


def test_observation_time_is_read(tmp_path):
    _obs_file(tmp_path / "o.nc")
    assert read_obs_netcdf(tmp_path / "o.nc").time.tolist() == [-3, -1, 1, 3]
    _obs_file(tmp_path / "p.nc", time=False)
    assert read_obs_netcdf(tmp_path / "p.nc").time is None
    both = ObsBatch.concat([read_obs_netcdf(tmp_path / "o.nc"),
                            read_obs_netcdf(tmp_path / "p.nc", id_offset=4)])
    assert np.isnan(both.time[4:]).all() and both.time[0] == -3


def test_qc_counts_observations_outside_the_window():
    ok, counts = quality_control(np.ones(4), np.ones(4), np.ones((3, 4)),
                                 in_window=np.array([True, False, True, False]))
    assert ok.tolist() == [True, False, True, False]
    assert counts.outside_window == 2 and counts.bad_prior == 0 and counts.accepted == 2


# ---------------------------------------------------------------- bad input, end to end


@pytest.fixture
def small_case(tmp_path):
    case = write_moving(tmp_path, nx=12, ny=6, members=3, slots=2, n_obs=10, speed=0.1)
    (tmp_path / "4d.yaml").write_text(config_text(case, True))
    return case


def _config(case):
    from ensio.config.load import load_config

    return load_config(case.directory / "4d.yaml")


def _unchanged(case):
    assert not (case.directory / "an").exists()


def test_missing_slot_file_is_one_error_nothing_written(small_case):
    (small_case.directory / "fc" / "mem002_slot2.nc").unlink()
    with pytest.raises(InputError, match=r"mem002_slot2\.nc: member file not found$"):
        run_analysis(_config(small_case), MPI.COMM_SELF)
    _unchanged(small_case)


def test_slot_file_of_wrong_shape_is_refused(small_case):
    write_state(small_case.directory / "fc" / "mem003_slot1.nc", 12, 5, np.zeros((5, 12)))
    with pytest.raises(InputError, match=r"mem003_slot1\.nc: variable 'state' has dims"):
        run_analysis(_config(small_case), MPI.COMM_SELF)
    _unchanged(small_case)


def test_observations_without_time_are_refused(small_case):
    d = small_case.directory
    _obs_file(d / "obs.nc", time=False)
    with pytest.raises(InputError, match=r"obs\.nc: variable 'time' missing .*time_slots"):
        run_analysis(_config(small_case), MPI.COMM_SELF)
    _unchanged(small_case)


def test_observations_outside_the_window_are_rejected_and_counted(small_case):
    d = small_case.directory
    with netCDF4.Dataset(d / "obs.nc", "a") as ds:
        t = ds["time"][:]
        t[:3] = [-3.5, 3.01, np.nan]
        ds["time"][:] = t
    rep = run_analysis(_config(small_case), MPI.COMM_SELF)
    qc = rep.result.qc
    assert qc.outside_window == 3 and qc.accepted == 7 and qc.bad_prior == 0
    assert any("outside_window 3" in line for line in rep.lines())


def test_online_mode_refuses_time_slots(small_case):
    from ensio.analysis.inputs import assimilate_block
    from ensio.io.modes.ensemble import read_ensemble

    cfg = _config(small_case)
    block = read_ensemble(cfg, MPI.COMM_SELF)
    with pytest.raises(ConfigError, match=r"^analysis\.time_slots: this mode does not read"):
        assimilate_block(block, [small_case.directory / "obs.nc"], cfg.analysis, MPI.COMM_SELF,
                         cycle=0, seconds={})


def test_tiled_members_need_the_slot_pattern(tmp_path):
    from ensio.config.schema import EnsembleSection
    from ensio.io.scan.slotstates import SlotStates

    ens = from_plain(EnsembleSection, {"members": "m{member}_{tile:04d}.nc", "size": 2,
                                       "variables": ["x"]}, "ensemble")
    with pytest.raises(ConfigError, match=r"^ensemble\.slots: required with tiled members"):
        SlotStates(ens, tmp_path, None, 1)  # type: ignore[arg-type]

"""Regional observation distribution: the same observations, the same analysis, no whole reads.

Every rank reads a slice of each observation file and receives the
observations near its rows (and those it owns) from the others. Against the
replicated path (every rank reads all locations), each rank must end with the
same observations in the same order, bit for bit, so the analysis, the QC
counts and the innovation statistics are identical; and no rank may read a
file whole (the reader is spied on). The observations include the awkward
ones: across the dateline, beyond the grid's last latitude, beyond a pole,
NaN values and NaN locations (rejected and counted as today).
"""

from __future__ import annotations

import dataclasses

import netCDF4
import numpy as np
import pytest

import ensio.obs.sources as sources
from ensio.analysis.inputs import assimilate_block, load_observations
from ensio.config import config_from_dict
from ensio.errors import InputError
from ensio.io.modes.ensemble import read_ensemble
from ensio.models.synthetic import SyntheticSpec, write_synthetic
from ensio.obs import ObsSource

NX, NY, MEMBERS = 36, 18, 6  # latitudes -85 .. 85, longitudes 0 .. 350: periodic
N_SCATTER = 500


def scatter_obs(path, levels, seed):
    """Observations without index: random, plus the dateline, the poles and bad values.

    Returns the expected (bad_value, outside) counts, computed here from the
    file's content and the grid's extent (independently of the code).
    """
    rng = np.random.default_rng(seed)
    n = N_SCATTER
    lon = rng.uniform(-180.0, 540.0, n)
    lat = np.degrees(np.arcsin(rng.uniform(-1, 1, n)))
    lon[:60] = rng.choice([-0.5, 359.7, 180.0, -179.9, 179.9], 60)  # both datelines
    lat[60:90] = rng.uniform(84.0, 90.0, 30) * rng.choice([-1, 1], 30)  # near/past last lat
    lat[90:95] = [95.0, -93.0, 100.0, 91.0, -120.0]  # beyond a pole
    value = rng.normal(0.0, 1.0, n)
    value[rng.choice(n, 12, replace=False)] = np.nan
    lon[200], lat[201] = np.nan, np.nan
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", n)
        error = np.full(n, 0.3)
        for name, data in (("lon", lon), ("lat", lat), ("value", value), ("error", error)):
            ds.createVariable(name, "f8", ("obs",))[:] = data
        if levels:
            ds.createVariable("level_index", "i8", ("obs",))[:] = rng.integers(0, levels, n)
    good = np.isfinite(value)
    outside = good & ~(np.isfinite(lon) & np.isfinite(lat) & (np.abs(lat) <= 85.0))
    return int((~good).sum()), int(outside.sum())


@pytest.fixture(params=[None, 3], ids=["2d", "3levels"])
def case(request, comm, shared_dir):
    levels = request.param
    counts = None
    if comm.rank == 0:
        write_synthetic(shared_dir, SyntheticSpec(nx=NX, ny=NY, members=MEMBERS, seed=11,
                                                  levels=levels))
        counts = scatter_obs(shared_dir / "scatter.nc", levels, seed=23)
    counts = comm.bcast(counts, root=0)
    coords = {"lon": "lon", "lat": "lat", **({"level": "lev"} if levels else {})}
    ensemble = {"members": str(shared_dir / "mem{member:03d}.nc"), "size": MEMBERS,
                "variables": ["state"], "coordinates": coords}
    return shared_dir, ensemble, counts


def analysis(filt, loc, distribution):
    return {"filter": filt, "localization": loc, "observations": {"distribution": distribution}}


def run_mode(comm, ensemble, files, section, monkeypatch):
    """Observations and analysis of one mode, and the slices every read covered."""
    cfg = config_from_dict({"ensemble": ensemble, "analysis": section, "observations": files,
                            "io": {"journal": False}})
    block = read_ensemble(cfg, comm)
    reads = []
    reader = sources.read_obs_file

    def spy(path, *args, **kwargs):
        batch, attr = reader(path, *args, **kwargs)
        reads.append((str(path), kwargs.get("part"), len(batch)))
        return batch, attr

    monkeypatch.setattr(sources, "read_obs_file", spy)
    paths = [ObsSource(cfg.resolve(f.file)) for f in cfg.observations]
    obs = load_observations(paths, cfg.analysis, block, comm)
    result = assimilate_block(block, paths, cfg.analysis, comm, cycle=3, seconds={})
    monkeypatch.setattr(sources, "read_obs_file", reader)
    return obs, result, reads


def assert_same_batch(a, b):
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (x is None) == (y is None), f.name
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), f.name


LOCS = [
    {"radius_km": 1500.0},
    {"radius_km": 400.0},
    {"radius_km": 9000.0},
    {"radius": 25.0},  # Euclidean in degrees
]


@pytest.mark.parametrize("filt", ["letkf", "lenkf"])
@pytest.mark.parametrize("loc", LOCS, ids=["1500km", "400km", "9000km", "euclid"])
def test_regional_equals_replicated(comm, case, monkeypatch, filt, loc):
    d, ensemble, (bad_value, outside) = case
    files = [str(d / "scatter.nc"), str(d / "obs.nc")]
    rep = run_mode(comm, ensemble, files, analysis(filt, loc, "replicated"), monkeypatch)
    reg = run_mode(comm, ensemble, files, analysis(filt, loc, "regional"), monkeypatch)
    assert_same_batch(rep[0], reg[0])
    a, b = rep[1], reg[1]
    assert np.array_equal(a.ensemble, b.ensemble)  # bitwise: the same observations, same order
    assert a.qc == b.qc and a.prior == b.prior and a.posterior == b.posterior
    assert a.qc.bad_value == bad_value and a.qc.outside == outside  # today's counts, both modes
    n_obs = {str(d / "scatter.nc"): N_SCATTER}
    with netCDF4.Dataset(d / "obs.nc") as ds:
        n_obs[str(d / "obs.nc")] = len(ds.dimensions["obs"])
    # no rank reads a file whole: each reads its own slice of each file, once per
    # load (run_mode loads twice: load_observations, then assimilate_block)
    assert sorted(p for p, _, _ in reg[2]) == sorted([*n_obs, *n_obs])
    for path, part, got in reg[2]:
        lo, hi = part
        n = n_obs[path]
        assert got == hi - lo <= -(-n // comm.size)
        assert comm.allreduce(hi - lo) == n
    if comm.size > 1 and loc.get("radius_km") == 400.0:
        assert len(reg[0]) < sum(n_obs.values())  # nobody holds everything


def test_periodic_index_localization(comm, case, monkeypatch):
    d, ensemble, _ = case
    loc = {"radius": 60.0, "periodic": NX * NY}
    rep = run_mode(comm, ensemble, [str(d / "obs.nc")], analysis("letkf", loc, "replicated"),
                   monkeypatch)
    reg = run_mode(comm, ensemble, [str(d / "obs.nc")], analysis("letkf", loc, "regional"),
                   monkeypatch)
    assert_same_batch(rep[0], reg[0])
    assert np.array_equal(rep[1].ensemble, reg[1].ensemble) and rep[1].qc == reg[1].qc


def test_bad_files_give_the_same_error_on_every_rank(comm, case, monkeypatch):
    d, ensemble, _ = case
    if comm.rank == 0:
        with netCDF4.Dataset(d / "named.nc", "w") as ds:
            ds.createDimension("obs", 7)
            for name in ("lon", "lat", "value", "error"):
                ds.createVariable(name, "f8", ("obs",))[:] = np.ones(7)
            ds.variable = "nope"
        with netCDF4.Dataset(d / "noerror.nc", "w") as ds:
            ds.createDimension("obs", 7)
            for name in ("lon", "lat", "value"):
                ds.createVariable(name, "f8", ("obs",))[:] = np.ones(7)
    comm.Barrier()
    loc = {"radius_km": 1000.0}
    for name, match in (("named.nc", "observed variable 'nope'"),
                        ("noerror.nc", "variable 'error' missing")):
        for mode in ("replicated", "regional"):
            with pytest.raises(InputError, match=match) as err:
                run_mode(comm, ensemble, [str(d / name)], analysis("letkf", loc, mode),
                         monkeypatch)
            assert str(d / name) in str(err.value)


def rank_batch(r):
    """Rank r's observations and destinations, reproducible on every rank."""
    from ensio.obs import ObsBatch

    rng = np.random.default_rng(1000 + r)
    m = int(rng.integers(0, 40))
    batch = ObsBatch(
        values=rng.standard_normal(m), errors=rng.uniform(0.1, 1, m),
        lon=rng.uniform(-180, 180, m), lat=rng.uniform(-90, 90, m),
        index=rng.integers(-1, 50, m), ids=r * 1000 + rng.permutation(m),
        level=np.where(rng.uniform(size=m) < 0.3, np.nan, rng.uniform(0, 5, m)),
    )
    return batch, rng


def test_route_delivers_every_record_to_its_destinations_bit_for_bit(comm):
    from ensio.obs.exchange import route

    batch, rng = rank_batch(comm.rank)
    pairs = rng.integers(0, [max(len(batch), 1), comm.size], size=(3 * len(batch), 2))
    pairs = pairs[: 3 * len(batch)] if len(batch) else np.empty((0, 2), np.int64)
    got = route(batch, pairs[:, 0], pairs[:, 1], comm)
    want = []
    for r in range(comm.size):
        b, g = rank_batch(r)
        p = g.integers(0, [max(len(b), 1), comm.size], size=(3 * len(b), 2))
        to_me = np.unique(p[p[:, 1] == comm.rank, 0]) if len(b) else np.empty(0, np.int64)
        want.append(b.subset(to_me))
    from ensio.obs import ObsBatch

    expect = ObsBatch.concat(want)
    expect = expect.subset(np.argsort(expect.ids))
    assert_same_batch(expect, got)
    assert got.variable is None and got.level_index is None


def test_auto_goes_regional_above_the_threshold(comm, case, monkeypatch):
    d, ensemble, _ = case
    files = [str(d / "obs.nc")]
    section = {"filter": "letkf", "localization": {"radius_km": 1500.0},
               "observations": {"distribution": "auto", "regional_above": 0}}
    _, res, reads = run_mode(comm, ensemble, files, section, monkeypatch)
    rep = run_mode(comm, ensemble, files, analysis("letkf", {"radius_km": 1500.0}, "replicated"),
                   monkeypatch)
    assert np.array_equal(res.ensemble, rep[1].ensemble)
    sliced = all(part is not None for _, part, _ in reads)
    assert sliced == (comm.size > 1)  # one rank: the replicated path, nothing to distribute

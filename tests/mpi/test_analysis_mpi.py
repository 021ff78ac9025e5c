"""The offline analysis under mpiexec: the same result for every N_mpi and N_io (issue 3).

Each run writes complete copies (``io.in_place: false``) into its own
sub-directory of ``shared_dir``, so every parameterization starts from the same
member files. The expected analysis is the in-memory, single-process
:func:`ensio.analysis.api.analyse` on the prior read with netCDF4, computed
on every rank; the outputs are read back with netCDF4.

N_mpi: the world communicator and every smaller prefix of it (so ``-n 4`` also
covers 1 and 3 ranks), each with every N_io in 1..N_mpi. All collective runs
happen before any assertion, so a failed check cannot leave ranks waiting.
"""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np
import pytest
from cases import (
    EnsembleCase,
    VarCase,
    make_obs_case,
    reference_matrix,
    row_lonlat,
    sha256,
    variable_bytes,
)
from mpi4py import MPI

from ensio.analysis.api import analyse
from ensio.config import config_from_dict
from ensio.config.analysis import AnalysisSection, InflationSection, LocalizationSection
from ensio.obs import ObsBatch, RegularGrid
from ensio.offline import run_analysis

# N_x = 7*11 + 2*7*11 = 231: blocks straddle the variable boundary for 2, 3 and 4 ranks
VARS = [VarCase("state", ("lat", "lon")), VarCase("t", ("lev", "lat", "lon"))]
CASE = EnsembleCase(members=5, nlat=7, nlon=11, nlev=2, variables=VARS, seed=21)
FILTERS = ("letkf", "lestkf", "etkf", "enkf", "lenkf")
LOCAL = {"letkf", "lestkf", "lenkf"}
CYCLE = 4
SEED = 5


def _analysis(name: str) -> tuple[dict, AnalysisSection]:
    # prior and posterior inflation together: both must be decomposition independent
    raw: dict = {"filter": name, "inflation": {"forget": 0.95, "posterior": 1.03}, "seed": SEED}
    kw: dict = {
        "filter": name,
        "inflation": InflationSection(forget=0.95, posterior=1.03),
        "seed": SEED,
    }
    if name in LOCAL:
        raw["localization"] = {"taper": "gaspari-cohn", "radius_km": 4500.0}
        kw["localization"] = LocalizationSection(taper="gaspari-cohn", radius_km=4500.0)
    return raw, AnalysisSection(**kw)


def _prepare(root: Path, comm: MPI.Comm):
    """Rank 0 writes members and observation files; everyone reads the prior with netCDF4."""
    made = None
    if comm.rank == 0:
        (root / "in").mkdir()
        paths = CASE.write(root / "in")
        X = reference_matrix(paths, VARS)
        coords = row_lonlat(paths[0], VARS)
        with netCDF4.Dataset(paths[0]) as ds:
            lon, lat = np.asarray(ds["lon"][:], float), np.asarray(ds["lat"][:], float)
        obs = make_obs_case(X, coords, lon, lat, np.random.default_rng(7))
        files = obs.write(root / "in")
        made = (paths, obs, files, lon, lat, [sha256(p) for p in [*paths, *files]])
    paths, obs, files, lon, lat, digests = comm.bcast(made, root=0)
    return paths, obs, files, RegularGrid(lon, lat), digests


@pytest.mark.parametrize("name", FILTERS)
def test_same_analysis_for_every_n_mpi_and_n_io(name, comm, shared_dir):
    paths, obs, files, grid, digests = _prepare(shared_dir, comm)
    assert np.any(obs.index >= 0) and np.any(obs.index < 0) and np.any(obs.missing)
    raw_an, section = _analysis(name)
    runs: dict[tuple[int, int], Path] = {}
    reports = {}
    for n_mpi in range(1, comm.size + 1):
        sub = comm.Split(0 if comm.rank < n_mpi else MPI.UNDEFINED, comm.rank)
        for n_io in range(1, n_mpi + 1):
            out = shared_dir / f"mpi{n_mpi}-io{n_io}"
            runs[n_mpi, n_io] = out
            if sub == MPI.COMM_NULL:
                continue
            raw = CASE.config(shared_dir / "in", tasks=n_io)
            raw["io"]["in_place"] = False
            raw["observations"] = [{"file": f"in/{p.name}"} for p in files]
            raw["analysis"] = raw_an
            raw["output"] = {
                "members": f"{out.name}/mem{{member:03d}}.nc",
                "mean": f"{out.name}/mean.nc",
            }
            cfg = config_from_dict(raw, base_dir=shared_dir)
            reports[n_mpi, n_io] = run_analysis(cfg, sub, cycle=CYCLE)
        if sub != MPI.COMM_NULL:
            sub.Free()
        comm.Barrier()

    # --- checks (no collectives from here on) ---
    X = reference_matrix(paths, VARS)
    batch = ObsBatch(values=obs.value, errors=obs.error, lon=obs.lon, lat=obs.lat, index=obs.index)
    coords = row_lonlat(paths[0], VARS)
    ref = analyse(X, batch, section, coords=coords, grid=grid, cycle=CYCLE)
    assert ref.qc.accepted == obs.value.size
    scale = np.max(np.abs(ref.ensemble))
    errors = {}
    for key, out in runs.items():
        copies = [out / f"mem{m:03d}.nc" for m in range(1, CASE.members + 1)]
        Xa = reference_matrix(copies, VARS)
        errors[key] = float(np.max(np.abs(Xa - ref.ensemble)) / scale)
        with netCDF4.Dataset(out / "mean.nc") as ds:
            mean = np.concatenate([np.asarray(ds[v.name][:]).ravel() for v in VARS])
        np.testing.assert_allclose(mean, Xa.mean(axis=0), rtol=1e-12)
        for src, dst in zip(paths, copies, strict=True):
            assert variable_bytes(dst, "aux") == variable_bytes(src, "aux")
    bad = {k: e for k, e in errors.items() if not e <= 1e-12}
    assert not bad, f"relative error > 1e-12 for (N_mpi, N_io): {bad}"
    for key, report in reports.items():
        r = report.result
        assert r.qc == ref.qc, key
        assert r.prior.count == ref.prior.count == obs.value.size
        assert r.prior.rms == pytest.approx(ref.prior.rms, rel=1e-12), key
        assert r.posterior.rms == pytest.approx(ref.posterior.rms, rel=1e-12), key
    assert [sha256(p) for p in [*paths, *files]] == digests

"""A rank holds its share of the observations, not all of them (the budget's "its observations").

Issue 14 bounds a rank's peak memory by its ensemble block, *its*
observations and one tile's work arrays, so with a local filter a rank must
load only the observations within the support radius of its rows plus those
it owns, and analyse only those near its rows. Checked here against a
great-circle distance computed independently (haversine, every observation to
every row), with an ambiguity band of 1e-9 of the radius around the cut-off.
"""

from __future__ import annotations

import numpy as np

from ensio.analysis.inputs import load_observations
from ensio.analysis.pipeline import AnalysisSettings, analyse_rows
from ensio.config import config_from_dict
from ensio.io.modes.ensemble import read_ensemble
from ensio.models.synthetic import SyntheticSpec, write_synthetic

RADIUS_KM = 1500.0


def haversine_km(lon1, lat1, lon2, lat2):
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dl, dp = np.radians(lon2 - lon1), p2 - p1
    h = np.sin(dp / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * 6371.0 * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def test_each_rank_loads_and_analyses_only_its_share(comm, shared_dir):
    if comm.rank == 0:
        write_synthetic(shared_dir, SyntheticSpec(nx=36, ny=18, members=5, seed=3))
    comm.Barrier()
    cfg = config_from_dict({
        "ensemble": {"members": str(shared_dir / "mem{member:03d}.nc"), "size": 5,
                     "variables": ["state"]},
        "observations": [str(shared_dir / "obs.nc")],
        "analysis": {"filter": "letkf", "localization": {"radius_km": RADIUS_KM}},
    })  # fmt: skip
    block = read_ensemble(cfg, comm)
    obs = load_observations([shared_dir / "obs.nc"], cfg.analysis, block, comm)
    every = load_observations([shared_dir / "obs.nc"], cfg.analysis, block,
                              comm.Split(comm.rank, 0))  # one rank alone: all of them  # fmt: skip
    assert 0 < len(obs) < len(every)

    # rows of this rank (lat-major (18, 36) grid) and their distance to every observation
    lon, lat = np.meshgrid(np.arange(36) * 10.0, np.arange(18) * 10.0 - 85.0)  # as synth writes
    rows = np.arange(block.start, block.start + block.count)
    rlon, rlat = lon.ravel()[rows], lat.ravel()[rows]
    d = haversine_km(every.lon[:, None], every.lat[:, None], rlon[None, :], rlat[None, :]).min(1)
    owned = (every.index >= block.start) & (every.index < block.start + block.count)
    must = (d < RADIUS_KM * (1 - 1e-9)) | owned
    may = must | (d <= RADIUS_KM * (1 + 1e-9))
    got = np.isin(every.ids, obs.ids)
    assert np.all(got[must]) and not np.any(got[~may])

    res = analyse_rows(block, obs, AnalysisSettings(cfg.analysis), comm)
    near = d < RADIUS_KM * (1 - 1e-9)
    assert near.sum() <= res.n_local_obs <= (d <= RADIUS_KM * (1 + 1e-9)).sum()
    assert res.n_local_obs < len(every)

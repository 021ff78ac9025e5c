"""A coupled model for the online tests: each rank reads its block of its member file.

Two uses:

- helpers (:func:`make_case`, :func:`config_dict`, :func:`read_block`) imported
  by ``tests/mpi/test_online.py`` and ``tests/test_online_spawn.py``;
- a program run as ``mpiexec -n N_e*P python tests/online_child.py ROOT P MODE``
  by ``tests/test_online_spawn.py``: it builds an :class:`ensio.online.Ensemble`
  from ``ROOT/online.yaml``, reads its block with the plain netCDF4 library,
  assimilates, and saves the returned block as
  ``ROOT/blocks/mem{member:03d}_p{p}.npy``. ``MODE`` makes it misbehave:

  ``ok``           no misbehaviour;
  ``wrong-size``   the last member's model rank 0 passes one value too few;
  ``raise``        member 2 raises in its "model code" before assimilating;
  ``stuck``        member 2 never calls assimilate (``timeout`` ends the job);
  ``filter-crash`` filter rank 0 fails inside the analysis, the others wait
                   in its collectives (``agree_timeout`` ends the job);
  ``bad-obs``      the observation file does not exist (an error every rank raises);
  ``exit``         member 2 calls ``sys.exit(3)`` instead of assimilating.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from cases import (  # noqa: E402
    EnsembleCase,
    VarCase,
    make_obs_case,
    read_rows,
    reference_matrix,
    row_lonlat,
)

# N_x = 7*11 + 2*7*11 = 231: blocks straddle the variable boundary for P = 2
VARS = [VarCase("state", ("lat", "lon")), VarCase("t", ("lev", "lat", "lon"))]
CYCLE = 3
MODES = ("ok", "wrong-size", "raise", "stuck", "filter-crash", "bad-obs", "exit")


def make_case(root: Path, members: int, seed: int = 21) -> tuple[list[Path], list[Path]]:
    """Member files ``root/in/mem*.nc`` and observation files; returns (members, obs files)."""
    case = EnsembleCase(members=members, nlat=7, nlon=11, nlev=2, variables=VARS, seed=seed)
    (root / "in").mkdir(parents=True, exist_ok=True)
    paths = case.write(root / "in")
    X = reference_matrix(paths, VARS)
    coords = row_lonlat(paths[0], VARS)
    import netCDF4

    with netCDF4.Dataset(paths[0]) as ds:
        lon, lat = np.asarray(ds["lon"][:], float), np.asarray(ds["lat"][:], float)
    obs = make_obs_case(X, coords, lon, lat, np.random.default_rng(7))
    return paths, obs.write(root / "in")


def config_dict(root: Path, members: int, out: str, filter_: str = "letkf") -> dict:
    """The analysis config (as for ``ensio analyse``), writing copies to ``root/out``."""
    analysis: dict = {
        "filter": filter_, "inflation": {"forget": 0.95, "posterior": 1.03}, "seed": 5,
    }
    if filter_ in ("letkf", "lestkf", "lenkf"):
        analysis["localization"] = {"taper": "gaspari-cohn", "radius_km": 4500.0}
    return {
        "ensemble": {
            "members": "in/mem{member:03d}.nc",
            "size": members,
            "variables": [v.name for v in VARS],
            "coordinates": {"lon": "lon", "lat": "lat"},
        },
        "io": {"in_place": False, "journal": False},
        "observations": [{"file": "in/obs_a.nc"}, {"file": "in/obs_b.nc"}],
        "analysis": analysis,
        "output": {
            "members": f"{out}/mem{{member:03d}}.nc",
            "mean": f"{out}/mean.nc",
            "spread": f"{out}/spread.nc",
        },
    }


def read_block(path: Path, rows: slice) -> np.ndarray:
    """This model rank's rows of a member file, read with netCDF4 (as a model would)."""
    return read_rows(path, VARS)[rows]


def main(argv: list[str]) -> int:
    from mpi4py import MPI

    from ensio.config import config_from_dict
    from ensio.online import Ensemble

    root, tasks, mode = Path(argv[0]), int(argv[1]), argv[2]
    assert mode in MODES, mode
    world = MPI.COMM_WORLD
    raw = yaml.safe_load((root / "online.yaml").read_text())
    if mode == "bad-obs":
        raw["observations"] = [{"file": "in/no-such-obs.nc"}]
    config = config_from_dict(raw, base_dir=root)
    ens = Ensemble(
        config,
        world,
        tasks_per_member=tasks,
        timeout=8.0 if mode == "stuck" else None,
        agree_timeout=5.0,
    )
    # --- the "model": read this rank's rows of its member
    x = read_block(config.member_paths()[ens.member - 1], ens.rows)
    if mode == "raise" and ens.member == 2:
        raise RuntimeError("the model of this member blew up")
    if mode == "exit" and ens.member == 2:
        sys.exit(3)
    if mode == "stuck" and ens.member == 2:
        threading.Event().wait()  # never returns: the other ranks' timeout ends the job
    if mode == "wrong-size" and ens.member == ens.n_members and ens.model_rank == 0:
        x = x[:-1]
    if mode == "filter-crash" and ens.is_filter and ens.model_rank == 0:
        import ensio.analysis.inputs as inputs  # the analysis step both modes share

        def crash(*args, **kwargs):
            raise FloatingPointError("simulated failure inside the analysis")

        inputs.analyse_rows = crash
    xa = ens.assimilate(x, cycle=CYCLE)
    out = root / "blocks"
    out.mkdir(exist_ok=True)
    np.save(out / f"mem{ens.member:03d}_p{ens.model_rank}.npy", xa)
    ens.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

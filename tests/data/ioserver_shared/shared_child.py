"""MPI child of tests/test_ioserver_shared.py: ranks write rows of one shared CDF-5 file.

Usage: ``mpiexec -n K python shared_child.py PATH SEED NJ NI NK NREC OWNER MODE [VICTIM]``.
MODE ``normal``: every rank writes its rows of every record, records and variables in
a rank-specific scrambled order; after each announcement the owner re-reads the file
with netCDF4 and checks that it holds exactly the announced records, with their data.
MODE ``crash``: records 0 and 1 are completed and announced, then rank VICTIM writes
one variable of record 2 and kills itself with SIGKILL while the others complete
record 2 and the owner polls (as a server loop would) until the job is torn down.

The global arrays come from :func:`make_case` (a seeded generator, not the code under
test); the test builds them again independently to check the file.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

import numpy as np

#: name -> (dtype, has levels)
VARIABLES = {"a2": ("f4", False), "b3": ("f8", True), "c3": ("f4", True), "d2": ("f8", False)}


@dataclass
class Case:
    nj: int
    ni: int
    nk: int
    nrec: int
    data: dict[str, np.ndarray]  # name -> (nrec, [nk,] nj, ni) in its dtype

    def times(self, record: int) -> dict[str, np.ndarray]:
        return {
            "time": np.float64(6 * record + 3),
            "time_bnds": np.array([6.0, 6.0]) * [record, record + 1],
        }

    def define(self, ds) -> None:
        ds.createDimension("time", None)
        ds.createDimension("nv", 2)
        ds.createDimension("lev", self.nk)
        ds.createDimension("lat", self.nj)
        ds.createDimension("lon", self.ni)
        t = ds.createVariable("time", "f8", ("time",))
        t.setncatts(
            {
                "units": "hours since 2000-01-01 00:00:00",
                "calendar": "standard",
                "standard_name": "time",
                "axis": "T",
                "bounds": "time_bnds",
            }
        )
        ds.createVariable("time_bnds", "f8", ("time", "nv"))
        lev = ds.createVariable("lev", "f8", ("lev",))
        lev.setncatts({"units": "Pa", "positive": "down", "axis": "Z"})
        lev[:] = np.linspace(1000.0, 100000.0, self.nk)
        lat = ds.createVariable("lat", "f8", ("lat",))
        lat.setncatts({"units": "degrees_north", "standard_name": "latitude"})
        lat[:] = np.linspace(-80.0, 80.0, self.nj)
        lon = ds.createVariable("lon", "f8", ("lon",))
        lon.setncatts({"units": "degrees_east", "standard_name": "longitude"})
        lon[:] = np.linspace(0.0, 360.0, self.ni, endpoint=False)
        for name, (dtype, levels) in VARIABLES.items():
            dims = ("time", "lev", "lat", "lon") if levels else ("time", "lat", "lon")
            ds.createVariable(name, dtype, dims).units = "1"
        ds.Conventions = "CF-1.8"


def make_case(seed: int, nj: int, ni: int, nk: int, nrec: int) -> Case:
    """The global arrays of every variable and record, from ``seed`` alone."""
    rng = np.random.default_rng(seed)
    data = {}
    for name, (dtype, levels) in VARIABLES.items():
        shape = (nrec, nk, nj, ni) if levels else (nrec, nj, ni)
        data[name] = rng.standard_normal(shape).astype(dtype)
    return Case(nj, ni, nk, nrec, data)


def _check_announced(path: str, case: Case, numrecs: int) -> None:
    """Owner: the file, read by netCDF4 now, holds exactly the announced records."""
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        assert ds.dimensions["time"].size == numrecs, (ds.dimensions["time"].size, numrecs)
        for name, full in case.data.items():
            got = np.ma.getdata(ds[name][:])
            assert np.array_equal(got, full[:numrecs]), f"{name}: announced data differs"
        expect = [case.times(r)["time"] for r in range(numrecs)]
        assert np.array_equal(ds["time"][:], expect)


def _write_record(f, case: Case, record: int, rng: np.random.Generator, names=None) -> None:
    lo, hi = f.rows.start, f.rows.start + f.rows.count
    for name in rng.permutation(sorted(names or VARIABLES)):
        f.write_rows(record, str(name), case.data[name][record][..., lo:hi, :])
        f.poll()


def main(argv: list[str]) -> None:
    from mpi4py import MPI

    from ensio.ioserver.shared import SharedRecordFile
    from ensio.parallel.distribution import RowDistribution

    path = argv[0]
    seed, nj, ni, nk, nrec, owner = (int(a) for a in argv[1:7])
    mode = argv[7]
    comm = MPI.COMM_WORLD
    case = make_case(seed, nj, ni, nk, nrec)
    f = SharedRecordFile(path, comm, owner, case.define, RowDistribution.of(nj, comm))
    rng = np.random.default_rng([seed, comm.rank])
    if mode == "crash":
        victim = int(argv[8])
        for record in (0, 1):
            _write_record(f, case, record, rng)
            f.record_done(record, case.times(record))
        while f.is_owner and f.numrecs < 2:  # the test's own sync point (spins on poll)
            f.poll()
        comm.Barrier()
        if comm.rank == victim:
            _write_record(f, case, 2, rng, names=["a2"])
            os.kill(os.getpid(), signal.SIGKILL)
        _write_record(f, case, 2, rng)
        f.record_done(2, case.times(2))
        if f.is_owner:
            while True:  # a server loop, polling until the job is torn down
                assert f.numrecs == 2 and not f.poll(), "announced a record a rank never finished"
        f.close()  # never returns: the victim never declares record 2
        sys.exit(3)
    for record in rng.permutation(nrec):
        _write_record(f, case, int(record), rng)
        f.record_done(int(record), case.times(int(record)))
        if f.poll():
            _check_announced(path, case, f.numrecs)
    numrecs = f.close()
    assert numrecs == nrec, (numrecs, nrec)
    if comm.rank == owner:
        _check_announced(path, case, nrec)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BaseException:  # end the whole job now, not at a collective the others wait in
        import traceback

        from mpi4py import MPI

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

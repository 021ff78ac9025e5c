"""Write-back companions under mpiexec: the files do not depend on N_mpi or io.tasks.

The same members and the same analysis (drawn from one seed, by global row) are
written by one process alone (COMM_SELF) and by every rank with each io.tasks;
the files must be byte-identical, for the byte-range path (each I/O task writes
its rows with their halo copies and level/``also`` increments, in disjoint ranges)
and the library path (one rewriter per file), and must hold what the rule says
(companions_support.expected).
"""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
from companions_support import expected, make_layout, read_all, write_members
from mpi4py import MPI
from seeds import draw_seed

from ensio.config.schema import IOSection
from ensio.io.modes.files import FileEnsembleIO


def _digests(paths):
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def _write(paths, layout, increments, tasks, comm):
    with FileEnsembleIO(paths, layout, IOSection(tasks=tasks), comm) as ens:
        block = ens.read()
        data = block.data + increments[:, block.start:block.start + block.count]
        ens.write(type(block)(block.layout, block.start, block.count, data))


@pytest.mark.parametrize("chunked", [False, True], ids=["byte-range", "library"])
def test_same_files_for_any_ranks_and_io_tasks(chunked, comm, shared_dir):
    seed = comm.bcast(draw_seed("companions mpi") if comm.rank == 0 else None)
    rng = np.random.default_rng(seed)
    base = shared_dir / "base"
    if comm.rank == 0:
        base.mkdir()
    comm.Barrier()
    members = write_members(base, 3, rng, chunked=chunked) if comm.rank == 0 else None
    members = comm.bcast(members)
    layout = make_layout(members.ocean)
    increments = rng.normal(0.0, 0.5, (3, layout.n_rows)) if comm.rank == 0 else None
    increments = comm.bcast(increments)
    increments[:, 5] = np.nan  # an inactive row

    def copy(name):
        if comm.rank == 0:
            shutil.copytree(base, shared_dir / name)
        comm.Barrier()
        return [shared_dir / name / p.name for p in members.paths]

    serial = copy("serial")
    if comm.rank == 0:
        _write(serial, layout, increments, 1, MPI.COMM_SELF)
    want = comm.bcast(_digests(serial) if comm.rank == 0 else None)
    for tasks in sorted({1, min(2, comm.size), comm.size}):
        paths = copy(f"tasks{tasks}")
        _write(paths, layout, increments, tasks, comm)
        comm.Barrier()
        assert _digests(paths) == want, tasks
    if comm.rank == 0:  # and the files hold the rule
        for m, path in enumerate(serial):
            prior = read_all(members.paths[m])
            got = read_all(path)
            rows = {}
            for v in layout.variables:
                r = prior[v.name].reshape(-1)[v.active].astype(np.float64) + \
                    increments[m, v.offset:v.offset + v.size]
                rows[v.name] = r
            want_m = expected(prior, rows, members.ocean)
            for name in want_m:
                np.testing.assert_allclose(got[name], want_m[name], rtol=1e-12, atol=0)

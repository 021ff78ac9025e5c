"""The stencil model decomposed over the ranks computes what one rank computes.

Rows are split in contiguous blocks (uneven at 4 ranks: 10 rows as 3, 3, 2, 2)
and every sweep exchanges one halo row with each neighbour; a wrong or missing
exchange changes the rows next to a rank boundary.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ensio.models.stencil import StencilModel

NZ, NY, NX = 3, 10, 12


def gather_rows(comm, model: StencilModel) -> np.ndarray:
    """The global ``(nz, ny, nx)`` field from every rank's rows, checking they tile ``ny``."""
    parts = sorted(comm.allgather((model.j0, model.t[:, 1:-1].copy())), key=lambda p: p[0])
    starts = [j0 for j0, _ in parts]
    ends = [j0 + rows.shape[1] for j0, rows in parts]
    assert starts[0] == 0 and ends[-1] == NY and starts[1:] == ends[:-1]
    return np.concatenate([rows for _, rows in parts], axis=1)


def test_decomposed_run_equals_one_rank(comm, rng):
    # one field for every rank: rank 0's draw (its seed is the one the report names)
    T0 = comm.bcast(280.0 + 10.0 * rng.standard_normal((NZ, NY, NX)) if comm.rank == 0
                    else None, root=0)
    one = StencilModel.build(NX, NY, NZ, MPI.COMM_SELF)
    split = StencilModel.build(NX, NY, NZ, comm)
    assert np.array_equal(gather_rows(comm, split), one.t[:, 1:-1])  # the initial state
    one.t[:, 1:-1] = T0
    split.t[:, 1:-1] = T0[:, split.j0:split.j0 + split.nj]
    for n in range(1, 4):
        one.step(MPI.COMM_SELF, n, sweeps=2)
        split.step(comm, n, sweeps=2)
    assert not np.allclose(one.t[:, 1:-1], T0, rtol=1e-3)  # the field did change
    # the same arithmetic on the same numbers, element by element: bit for bit
    assert np.array_equal(gather_rows(comm, split), one.t[:, 1:-1])

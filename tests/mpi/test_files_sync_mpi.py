"""``io.mode: files`` under mpiexec: recovery shares the member check's one collective.

Rank 0 recovers the journal while the other ranks may already be looking at
the files it restores; every rank must then read the restored bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from cases import EnsembleCase, VarCase, reference_matrix, sha256

from ensio.config import config_from_dict
from ensio.io.formats.open import open_member
from ensio.io.modes.ensemble import open_ensemble
from ensio.io.txn.journal import JOURNAL_DIRNAME
from ensio.io.txn.undolog import UndoLog


def _crash_midway(root, path, rng) -> None:
    """What a writer killed mid-write leaves: an undo record, then overwritten state bytes."""
    with open_member(path) as store:
        info = store.variables()["state"]
    log = UndoLog.create(root, 7, fsync=False)
    with open(path, "r+b") as f:
        f.seek(info.raw_offset)
        log.save(path, info.raw_offset, f.read(info.nbytes))
        f.seek(info.raw_offset)
        f.write(rng.integers(0, 256, info.nbytes, np.uint8).tobytes())
    log.close()


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_64BIT_DATA"])
def test_every_rank_reads_what_recovery_restored(fmt, comm, shared_dir):
    case = EnsembleCase(members=4, fmt=fmt, seed=71,
                        variables=[VarCase("state", ("lat", "lon"), "f8")])
    paths = case.write(shared_dir) if comm.rank == 0 else None
    paths = comm.bcast(paths, root=0)
    expected = reference_matrix(paths, case.variables)
    digests = [sha256(p) for p in paths]
    rng = np.random.default_rng(72)
    cfg = config_from_dict(case.config(shared_dir, tasks=comm.size))
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, comm) as ens:
        block = ens.read()
        rows = slice(block.start, block.start + block.count)
        for victim in range(len(paths)):  # each member, checked by each rank in turn
            if comm.rank == 0:
                _crash_midway(shared_dir, paths[victim], rng)
            comm.Barrier()
            block = ens.read(out=block)
            np.testing.assert_array_equal(block.data, expected[:, rows])
            assert [sha256(p) for p in paths] == digests
            assert not (shared_dir / JOURNAL_DIRNAME).exists()
            comm.Barrier()  # every rank has looked before rank 0 breaks the next member

"""``io.mode: shuffle`` with one local directory shared by every rank (issue 25, item 7).

A node's ``/local`` is shared by its ranks, so ``io.local_dir`` without
``{rank}`` puts every tile of the node in one directory; on one host it may
even be the global directory itself (the tiles analysed where they lie). The
run takes that directory's lock and journal once, as one run (the global
lock's holder, rank 0, is joined, not reported as a foreign holder), and the
result equals the ``files``-mode analysis of the untiled members. The serial
driver on 8 ranks is tests/test_shuffle_shared.py.
"""

from __future__ import annotations

import shutil

import pytest
from test_shuffle_mpi import make_case, reference, shapes_for
from tiles_support import PATTERN, assert_tile_holds, tile_values

from ensio.config.load import load_config
from ensio.offline import run_analysis

MARKERS = (".ensio-journal", ".ensio-lock", "ensio-tmp", "ensio-staged")


@pytest.mark.parametrize("where", ["node", "global"])
def test_shared_local_dir_equals_files_mode(shared_dir, comm, where) -> None:
    """Every (N_e, P, S) that fits: one directory for all ranks (``node``: a copy of
    every tile, as ``ensio stage in`` makes it; ``global``: the tiles' own directory,
    whose lock rank 0 holds as the global lock) holds the files-mode analysis; a rerun
    is "already analysed"; no journal, lock or temporary is left."""
    for n_e, p, s in shapes_for(comm.size):
        case, geo, sets = make_case(shared_dir, comm, n_e, p, s)
        _, full_ref, layout = reference(case, comm)
        v = layout.variables[0]
        local = case / "node" if where == "node" else case / "tiles"
        names = [PATTERN.format(member=f // p + 1, tile=f % p).split("/")[-1]
                 for f in range(n_e * p)]
        if comm.rank == 0 and where == "node":
            local.mkdir()
            for name in names:
                shutil.copy(case / "tiles" / name, local / name)
        comm.Barrier()
        before = [tile_values(local / name) for name in names]
        comm.Barrier()
        cfg = load_config(case / "ensio.yaml",
                          [x for x in sets if not x.startswith("io.local_dir")]
                          + [f"io.local_dir={local}"])
        report = run_analysis(cfg, comm)
        assert report.result is not None and report.already is None
        comm.Barrier()
        for f, name in enumerate(names):
            want = full_ref[f // p].reshape(v.shape)
            assert_tile_holds(tile_values(local / name), before[f], want, geo.boxes[f % p])
        assert run_analysis(cfg, comm).already is not None
        comm.Barrier()  # rank 0 releases the global lock after the run returns
        assert sorted(str(x) for x in case.rglob("*") if any(m in x.name for m in MARKERS)) == []
        comm.Barrier()

"""``io.mode: shuffle`` under mpiexec: the ensemble lock and the run record (issue 13).

A shuffle run holds the global ensemble lock, records itself in the global
run record (tile digests keyed ``host:path``, the transaction id), refuses a
rerun of the same analysis as ``files`` mode does, analyses again with
``force`` or after a tile changed. Results are compared with a ``files``-mode
analysis of the untiled members (in process, not through the shuffle).
The kill tests (SIGKILL at the commit's steps) are in tests/test_shuffle_commit.py.
"""

from __future__ import annotations

import hashlib
import json
import os

import netCDF4
import numpy as np
import pytest
from shuffle_commit_support import NX, NY, SHAPES, make_shuffle_case
from tiles_support import tile_values

from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.config.load import load_config
from ensio.io.modes.ensemble import read_ensemble
from ensio.locks import EnsembleLock, LockError
from ensio.offline import run_analysis
from ensio.parallel.nodes import this_host


@pytest.fixture
def case(shared_dir, comm):
    if comm.size not in SHAPES:  # CI runs -n 2 and -n 4: never skipped there
        pytest.skip("needs 2 or 4 ranks")
    made = make_shuffle_case(shared_dir / "case", comm.size) if comm.rank == 0 else None
    return comm.bcast(made)


def files_mode_reference(case, comm) -> np.ndarray:
    """The ``files``-mode analysis of the untiled members, whole (N_e, N_x)."""
    cfg = load_config(case.root / "files.yaml")
    prior = read_ensemble(cfg, comm)
    obs = observation_sources(cfg.observations, cfg.resolve)
    ref = assimilate_block(prior, obs, cfg.analysis, comm, cycle=0, seconds={})
    return np.concatenate(comm.allgather(ref.ensemble), axis=1)


def stamps(case) -> list[tuple[int, str]]:
    return [(os.stat(t).st_mtime_ns, hashlib.sha256(t.read_bytes()).hexdigest())
            for t in case.tiles()]


def test_record_rerun_force_and_modified_tile(case, comm) -> None:
    ref = files_mode_reference(case, comm)
    comm.Barrier()
    cfg = load_config(case.config)
    first = run_analysis(cfg, comm)
    assert first.result is not None and first.already is None
    for f, path in enumerate(case.tiles()):  # the files-mode analysis, tile by tile
        b = case.boxes[f % case.p]
        iy, ix = b.interior()
        want = ref[f // case.p].reshape(NY, NX)[b.y0 : b.y1, b.x0 : b.x1]
        np.testing.assert_allclose(tile_values(path)[iy, ix], want, rtol=0, atol=1e-12)
    lines = (case.global_dir / ".ensio-runs.jsonl").read_text().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert len(entry["txid"]) == 32 and entry["products"] == {}
    assert entry["members"] == {f"{this_host()}:{t}": d
                                for t, d in zip(case.tiles(), case.digests(), strict=True)}
    comm.Barrier()  # rank 0 releases the global lock after the run returns
    assert case.leftovers() == []
    comm.Barrier()

    before = stamps(case)
    comm.Barrier()
    again = run_analysis(cfg, comm)
    assert again.result is None and again.already is not None
    assert again.lines()[0].startswith("already analysed: the members hold this analysis")
    assert "--force" in again.lines()[0]
    assert stamps(case) == before  # nothing touched: bytes and mtime
    comm.Barrier()

    forced = run_analysis(cfg, comm, force=True)
    assert forced.result is not None
    assert case.digests() != [d for _, d in before]
    assert len((case.global_dir / ".ensio-runs.jsonl").read_text().splitlines()) == 2
    comm.Barrier()
    assert run_analysis(cfg, comm).already is not None  # the forced run is recorded
    comm.Barrier()

    if comm.rank == 0:  # a new forecast of one tile
        with netCDF4.Dataset(case.tile(case.n_e * case.p - 1), "a") as ds:
            ds["state"][1, 1] = np.float64(ds["state"][1, 1]) + 1.0
    comm.Barrier()
    changed = run_analysis(cfg, comm)
    assert changed.result is not None and changed.already is None
    comm.Barrier()  # rank 0 releases the global lock after the run returns
    assert case.leftovers() == []


@pytest.mark.parametrize("where", ["global", "local"])
def test_held_lock_fails_every_rank_and_modifies_nothing(case, comm, where) -> None:
    """Another run holding the global lock, or ``ensio recover LOCAL_DIR`` (or a second
    run) holding one local directory's lock."""
    before = stamps(case)
    if where == "global":
        path, holder = case.global_dir, "ensio analyse other.yaml"
        match = r"^members locked by `ensio analyse other.yaml`"
    else:
        path, holder = case.locals[-1], "ensio recover"
        match = f"^members locked by `ensio recover`.*{case.locals[-1]}"
    lock = EnsembleLock(path, holder) if comm.rank == 0 else None
    if lock is not None:
        lock.acquire()
    comm.Barrier()
    try:
        with pytest.raises(LockError, match=match):
            run_analysis(load_config(case.config), comm)
    finally:
        comm.Barrier()
        if lock is not None:
            lock.release()
    assert stamps(case) == before
    if where == "global":
        assert not (case.global_dir / ".ensio-runs.jsonl").exists()
    else:
        comm.Barrier()  # rank 0 releases the global lock after the run returns
        assert case.leftovers() == []


def test_unjournaled_run_is_recorded_too(case, comm) -> None:
    """``io.journal: false`` (no undo logs, no atomicity) still records the run."""
    cfg = load_config(case.config, ["io.journal=false"])
    assert run_analysis(cfg, comm).result is not None
    comm.Barrier()
    assert not any((d / ".ensio-journal").exists() for d in case.locals)
    assert run_analysis(cfg, comm).already is not None
    comm.Barrier()  # rank 0 releases the global lock after the run returns
    assert case.leftovers() == []


def test_failed_decision_rolls_every_directory_back(case, comm, monkeypatch) -> None:
    """The record cannot be written (rank 0): every rank raises, every tile is prior."""
    from ensio.errors import FileOpError
    from ensio.io.txn import shufflecommit

    before = stamps(case)
    if comm.rank == 0:
        def full(*args, **kwargs):
            raise OSError("disk full (test)")

        monkeypatch.setattr(shufflecommit, "staged_runs", full)
    with pytest.raises((OSError, FileOpError), match="disk full"):
        run_analysis(load_config(case.config), comm)
    comm.Barrier()
    assert [d for _, d in stamps(case)] == [d for _, d in before]
    assert not (case.global_dir / ".ensio-runs.jsonl").exists()
    comm.Barrier()  # rank 0 releases the global lock after the run returns
    assert case.leftovers() == []

"""Staging and backup under mpiexec: one process per node, errors agreed on every rank.

Several "hosts" stand up on one machine: each rank names its host
(``host=``, what ``{host}`` stands for), and the node split separates ranks
that name different hosts, so a 4-rank run has 1, 2 or 4 node leaders.
"""

from __future__ import annotations

import numpy as np
import pytest
from stage_support import make_case, make_dirs, sha, tree

from ensio.errors import InputError
from ensio.io.node.backup import restore_from_backup, start_cycle_backup
from ensio.io.node.backupworker import BackupAttempt
from ensio.io.node.placenode import place_ensemble as stage

HOSTS = {"one": lambda r: "h0", "pairs": lambda r: f"h{r // 2}", "each": lambda r: f"h{r}"}


def _case(shared_dir, comm, n_e, n_tiles):
    root = shared_dir / "case"
    rng = np.random.default_rng(21)
    if comm.rank == 0:
        make_case(root, rng, n_e=n_e, n_tiles=n_tiles)
    comm.Barrier()
    return make_case(root, rng, n_e=n_e, n_tiles=n_tiles, write=False)


def _shapes(size):
    """(N_e, P): one file per rank (shuffle: N_e * P = N_mpi) and more files than ranks."""
    return [(max(1, size // 2), 2 if size > 1 else 1), (3, 2)]


@pytest.mark.parametrize("hosts", sorted(HOSTS))
@pytest.mark.parametrize("shape", [0, 1])
def test_stage_in_out_each_rank_holds_its_files(shared_dir, comm, hosts, shape):
    n_e, n_tiles = _shapes(comm.size)[shape]
    case = _case(shared_dir, comm, n_e, n_tiles)
    host = HOSTS[hosts](comm.rank)
    names = comm.allgather(host)
    make_dirs(case.local_dirs(comm.size, names)[comm.rank:comm.rank + 1])  # its own only
    comm.Barrier()
    report = stage(case.config, "in", comm, host=host, n_ranks=comm.size)
    assert report.nodes == len(set(names)) and report.copied == n_e * n_tiles
    mine = [(m, t) for m in range(1, n_e + 1) for t in range(n_tiles)
            if ((m - 1) * n_tiles + t) % comm.size == comm.rank]
    if n_e * n_tiles == comm.size:  # rank m*P + p holds tile p of member m
        assert mine == [(comm.rank // n_tiles + 1, comm.rank % n_tiles)]
    for key in mine:
        local = case.expected_local(*key, comm.size, host)
        assert local.read_bytes() == case.files[key].read_bytes()
        local.write_bytes(f"analysis of {key}".encode())  # this rank's analysis
    comm.Barrier()
    out = stage(case.config, "out", comm, host=host, checksum=True, n_ranks=comm.size)
    assert out.copied == n_e * n_tiles
    for key in mine:
        assert case.files[key].read_bytes() == f"analysis of {key}".encode()
    assert stage(case.config, "out", comm, host=host, n_ranks=comm.size).copied == 0


@pytest.mark.parametrize("hosts", ["pairs", "each"])
def test_missing_local_dir_on_one_rank_is_one_error_everywhere(shared_dir, comm, hosts):
    case = _case(shared_dir, comm, 3, 2)
    host = HOSTS[hosts](comm.rank)
    names = comm.allgather(host)
    dirs = case.local_dirs(comm.size, names)
    last = comm.size - 1
    if comm.rank != last:
        make_dirs([dirs[comm.rank]])  # the last rank's node lacks its directory
    comm.Barrier()
    before = tree(shared_dir) if comm.rank == 0 else None
    with pytest.raises(InputError) as err:
        stage(case.config, "in", comm, host=host, n_ranks=comm.size)
    messages = comm.allgather(str(err.value))
    assert messages == [messages[0]] * comm.size
    assert messages[0] == (f"{dirs[last]}: local directory (io.local_dir) does not exist "
                           f"(rank {last} on host {names[last]}); nothing copied")
    comm.Barrier()
    if comm.rank == 0:
        assert tree(shared_dir) == before


@pytest.mark.parametrize("hosts", ["one", "each"])
def test_backup_and_restore_under_mpi(shared_dir, comm, hosts):
    case = _case(shared_dir, comm, 3, 2)
    host = HOSTS[hosts](comm.rank)
    handle = start_cycle_backup(case.config, comm, 3, host=host)
    marker_path = handle.wait()
    backup = shared_dir / "case" / "backup" / "c003"
    assert marker_path == backup / "COMPLETE"
    marker = BackupAttempt.completed(backup)
    assert marker["nodes"] == len(set(comm.allgather(host)))
    files = {(f["member"], f["tile"]): f for f in marker["files"]}
    assert set(files) == set(case.files)
    for (m, t), f in files.items():
        assert f["rank"] == ((m - 1) * 2 + t) % comm.size
        assert f["sha256"] == sha(case.files[m, t])
    comm.Barrier()
    if comm.rank == 0:
        for p in case.files.values():
            p.write_bytes(b"lost")
    comm.Barrier()
    cycle, report = restore_from_backup(case.config, comm, host=host)
    assert (cycle, report.copied) == (3, 6)
    for (m, t), f in files.items():
        assert sha(case.files[m, t]) == f["sha256"]

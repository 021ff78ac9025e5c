"""``ensio bench shuffle``: the cost model by hand, and a tiny run's MPI bytes and partners.

The bytes and partners are checked against counts made here from the
definitions (rows per rank of each scheme), not against the driver's output.
"""

from __future__ import annotations

import json

import needs
import numpy as np
import pytest

from ensio.bench.shuffle_model import measured_costs, t_files, t_shuffle
from ensio.cli.main import main as ensio_main

COSTS = {"alpha": 2e-6, "beta": 1e-9, "c_fs": 3e-9, "c_local": 1e-9, "c_open": 1e-4}


def test_model_by_hand() -> None:
    # files: N = 80 ranks, N_e = 4 readers, S = 1e9 B; each reader reads 1e9 B
    # at max(3e-9, 4 / 1e11) s/B, scatters 1e9 * (1 - 4/80) B, to 19 partners
    want = 4 * 1e-4 + 1e9 * 3e-9 + 1e9 * 0.95 * 1e-9 + 19 * 2e-6
    assert t_files(np.array([80]), 4, 1e9, 1e11, COSTS)[0] == pytest.approx(want, rel=1e-12)
    # a slow global file system: 4 readers share 1e9 B/s, so 4e-9 s/B each
    slow = 4 * 1e-4 + 1e9 * 4e-9 + 1e9 * 0.95 * 1e-9 + 19 * 2e-6
    assert t_files(np.array([80]), 4, 1e9, 1e9, COSTS)[0] == pytest.approx(slow, rel=1e-12)
    # every rank a reader: 80 readers of 5e7 B each, their share of 1e11 B/s is 8e-10 s/B
    # (faster than c_fs 3e-9), no scatter, no partners
    every = 4 * 1e-4 + 5e7 * 3e-9
    assert t_files(np.array([80]), 4, 1e9, 1e11, COSTS, every_rank=True)[0] == pytest.approx(
        every, rel=1e-12)
    # shuffle: P = 20 tiles of 5e7 B, 3/4 of it sent to 3 partners
    want = 1e-4 + 5e7 * 1e-9 + 5e7 * 0.75 * 1e-9 + 3 * 2e-6
    assert t_shuffle(np.array([80]), 4, 1e9, COSTS)[0] == pytest.approx(want, rel=1e-12)


def test_measured_costs_skip_oversubscribed_runs() -> None:
    def run(n, alpha):
        return {"n_mpi": n, "members": 2, "alpha_seconds": alpha, "open_seconds": 1e-3,
                "files": {"n_io": 2, "phases": {"read": 2e-3}},
                "shuffle": {"part_bytes": 1000, "phases": {"read": 1e-6, "shuffle": alpha + 5e-7}}}
    res = {"state_bytes_per_member": 1000, "oversubscribed": [8],
           "runs": [run(2, 1e-5), run(8, 1.0)]}
    c = measured_costs(res)
    assert c["alpha"] == 1e-5
    assert c["c_fs"] == pytest.approx(2e-3 / 1000)  # each reader: 2 members x 500 B
    assert c["c_local"] == pytest.approx(1e-9)
    assert c["beta"] == pytest.approx(5e-7 / 500)  # half the part leaves the rank


def test_tiny_run_bytes_and_partners(tmp_path, capsys) -> None:
    needs.mpiexec(path_fallback=True)
    nx, ny, n_e = 24, 12, 2
    out = tmp_path / "r.json"
    png = tmp_path / "r.png"
    argv = ["bench", "shuffle", "--nx", str(nx), "--ny", str(ny), "--levels", "1",
            "--members", str(n_e), "--ranks", "2,4", "--repeat", "1",
            "--json", str(out), "--plot", str(png)]
    assert ensio_main(argv) == 0
    res = json.loads(out.read_text())
    n_x = nx * ny
    # shuffle, read + write: every member's state leaves its reader but 1/N_e of it
    moved = 2 * 8 * n_e * n_x * (n_e - 1) // n_e
    assert res["mpi_bytes_shuffle"] == {"2": moved, "4": moved}
    assert res["partners_shuffle"] == {"2": n_e - 1, "4": n_e - 1}
    # files, N_io = 2 readers: at N_mpi = 2 nothing moves; at 4 each reader sends the
    # rows of the other rank of its group (N_x / 4) of both members, read and write
    assert res["mpi_bytes_files"] == {"2": 0, "4": 2 * 2 * 8 * n_e * n_x // 4}
    assert res["partners_files"] == {"2": 0, "4": 1}
    assert set(res["seconds_files"]) == set(res["seconds_shuffle"]) == {"2", "4"}
    assert png.stat().st_size > 0
    assert "ensio bench shuffle" in capsys.readouterr().out

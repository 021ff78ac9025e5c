"""The shared tile scan in ``io.mode: shuffle`` (and ``files`` under MPI), issue 25 item 6.

Each rank reads its own tile from its local directory; a tile out of place
(coordinates shifted, two tiles of a member swapped, ``DOMAIN_*`` of member 2
disagreeing) is refused on every rank with one message naming the file and
the variable or attribute, and no file anywhere is modified (sha256 of every
file under the case before and after). The same case in ``files`` mode, read
from the global tiles by every rank's share of the scan, is refused alike.
"""

from __future__ import annotations

import hashlib
import shutil

import netCDF4
import numpy as np
import pytest
from tiles_support import PATTERN, tile_case

from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.errors import InputError
from ensio.layout.tiles import declared_geometry
from ensio.offline import run_analysis

NX, NY, NE = 11, 10, 2


def make(root, comm, *, nemo=False, time=False):
    """N_e = 2 members of P = N_mpi / 2 tiles (layout 1 x P along lat, halo 1), each tile
    copied to the local directory of rank f = m·P + t; the ``--set`` options of both modes.
    ``time``: the members get a time coordinate (one record) before they are cut."""
    p = comm.size // NE
    geo = declared_geometry((NY, NX), p, (1, p), 1)
    case = root / "case"
    if comm.rank == 0:
        assert synth_main([str(case), "--nx", str(NX), "--ny", str(NY), "--members", str(NE),
                           "--seed", "3", "--format", "cdf5"]) == 0  # fmt: skip
        for m in range(1, NE + 1) if time else ():
            with netCDF4.Dataset(case / f"mem{m:03d}.nc", "a") as ds:
                ds.createDimension("time", 1)
                ds.createVariable("time", "f8", ("time",))[:] = [40.5]
        tile_case(case, geo, NE, nemo=nemo)
        for f in range(NE * p):
            local = case / "local" / f"r{f}"
            local.mkdir(parents=True)
            src = case / PATTERN.format(member=f // p + 1, tile=f % p)
            shutil.copy(src, local / src.name)
    comm.Barrier()
    sets = [f"ensemble.members={PATTERN}", "output.mean=null", "output.spread=null",
            "io.local_dir=local/r{rank}"]  # fmt: skip
    if not nemo:
        sets.append(f"ensemble.tiles={{count: {p}, layout: [1, {p}], halo: 1}}")
    return case, geo, sets


def local(case, f, p):
    return case / "local" / f"r{f}" / PATTERN.format(member=f // p + 1, tile=f % p).split("/")[-1]


def snapshot(case):
    return {str(x): hashlib.sha256(x.read_bytes()).hexdigest()
            for x in sorted(case.rglob("*")) if x.is_file()}  # fmt: skip


def refused(case, comm, sets, mode, *words):
    comm.Barrier()
    before = snapshot(case) if comm.rank == 0 else None
    comm.Barrier()
    cfg = load_config(case / "ensio.yaml", [*sets, f"io.mode={mode}"])
    with pytest.raises(InputError) as info:
        run_analysis(cfg, comm)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1, msg
    for w in words:
        assert w in msg, msg
    assert comm.allgather(msg) == [msg] * comm.size  # the same error on every rank
    comm.Barrier()
    if comm.rank == 0:
        assert snapshot(case) == before


def edit(path, name, change):
    with netCDF4.Dataset(path, "a") as ds:
        ds[name][...] = change(np.array(ds[name][...]))


@pytest.mark.parametrize("name,change", [("lon", lambda v: v + 0.5), ("lat", lambda v: v - 1.0)])
@pytest.mark.parametrize("mode", ["shuffle", "files"])
def test_shifted_tile_of_member_2(shared_dir, comm, name, change, mode) -> None:
    case, geo, sets = make(shared_dir, comm)
    p = geo.count
    f = NE * p - 1  # the last tile of member 2
    bad = local(case, f, p) if mode == "shuffle" else case / PATTERN.format(member=2, tile=p - 1)
    if comm.rank == 0:
        edit(bad, name, change)
    refused(case, comm, sets, mode, str(bad), f"'{name}'")


@pytest.mark.parametrize("mode", ["shuffle", "files"])
def test_time_of_one_tile(shared_dir, comm, mode) -> None:
    """Every tile of every member at the same time (exactly), in both modes."""
    case, geo, sets = make(shared_dir, comm, time=True)
    p = geo.count
    f = NE * p - 1
    bad = local(case, f, p) if mode == "shuffle" else case / PATTERN.format(member=2, tile=p - 1)
    if comm.rank == 0:
        edit(bad, "time", lambda v: v + 1)
    refused(case, comm, sets, mode, str(bad), "'time'")


@pytest.mark.parametrize("nemo", [False, True], ids=["declared", "nemo"])
@pytest.mark.parametrize("mode", ["shuffle", "files"])
def test_swapped_tiles_of_member_2(shared_dir, comm, nemo, mode) -> None:
    case, geo, sets = make(shared_dir, comm, nemo=nemo)
    p = geo.count
    if p < 2:
        pytest.skip("one tile per member at this rank count: nothing to swap")
    if mode == "shuffle":
        a, b = local(case, p, p), local(case, p + 1, p)  # tiles 0 and 1 of member 2
    else:
        a, b = (case / PATTERN.format(member=2, tile=t) for t in (0, 1))
    if comm.rank == 0:
        data_a, data_b = a.read_bytes(), b.read_bytes()
        a.write_bytes(data_b)
        b.write_bytes(data_a)
    comm.Barrier()
    refused(case, comm, sets, mode, str(a))


@pytest.mark.parametrize("mode", ["shuffle", "files"])
def test_domain_size_of_member_2(shared_dir, comm, mode) -> None:
    case, geo, sets = make(shared_dir, comm, nemo=True)
    p = geo.count
    bad = local(case, p, p) if mode == "shuffle" else case / PATTERN.format(member=2, tile=0)
    if comm.rank == 0:
        with netCDF4.Dataset(bad, "a") as ds:
            ds.setncattr("DOMAIN_size_global", np.array([NX + 80, NY], dtype=np.int32))
    refused(case, comm, sets, mode, str(bad), "DOMAIN_size_global")

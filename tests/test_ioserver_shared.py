"""Row ranges of one CDF-5 file shared among server ranks (``ioserver.shared``).

- ``record_layout`` against the netCDF library: files written by netCDF4 in the
  three classic formats, with record variables of every padding case, read back
  as raw bytes at the offsets the layout gives.
- ``SharedRecordFile`` serially (one rank): announcement order, validation errors.
- Under ``mpiexec -n 2`` and ``-n 3``: ranks write their rows of 2-D and 3-D,
  float32 and float64 record variables, records in scrambled order; the file read
  with netCDF4 and ``ncdump`` equals the global arrays (rebuilt here from the seed).
- A reader process outside the job, reading while the ranks write, only ever
  sees complete records.
- A rank killed by SIGKILL in the middle of record 2: the file holds exactly
  records 0 and 1 (``ncdump -h``), its data, and ``cdo sinfon`` accepts it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import needs
import netCDF4
import numpy as np
import pytest
from mpi4py import MPI

from ensio.io.formats.classic import read_classic_header, record_layout
from ensio.ioserver.shared import SharedRecordFile
from ensio.parallel.distribution import RowDistribution

CHILD = Path(__file__).parent / "data" / "ioserver_shared" / "shared_child.py"
MPIEXEC = Path(sys.executable).with_name("mpiexec")
SRC = Path(__file__).resolve().parents[1] / "src"
FORMATS = {1: "NETCDF3_CLASSIC", 2: "NETCDF3_64BIT_OFFSET", 5: "NETCDF3_64BIT_DATA"}


def _child_module():
    spec = importlib.util.spec_from_file_location("shared_child", CHILD)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


# -- record_layout against the netCDF library -----------------------------------------------

#: Record-variable sets: (name, dtype, extra shape); odd byte counts test the padding.
LAYOUT_CASES = {
    "mixed": [("t", "f8", ()), ("b", "i1", (3,)), ("s", "i2", (5,)), ("x", "f4", (4, 3))],
    "lone_byte": [("b", "i1", (7,))],  # a lone record variable is not padded
    "lone_short": [("s", "i2", (3,))],
    "padded_last": [("x", "f4", (2,)), ("b", "i1", (5,))],
    "scalar_and_3d": [("t", "f8", ()), ("y", "f8", (2, 3, 5))],
}


@pytest.mark.parametrize("version", sorted(FORMATS))
@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_record_layout_matches_netcdf(
    tmp_path: Path, rng: np.random.Generator, version: int, case: str
) -> None:
    path = tmp_path / "f.nc"
    nrec = int(rng.integers(2, 5))  # >= 2: record 1 checks recsize
    written, var_dims = {}, {}
    with netCDF4.Dataset(path, "w", format=FORMATS[version]) as ds:
        ds.createDimension("time", None)
        ds.createDimension("fixed", 3)
        ds.createVariable("c", "f8", ("fixed",))[:] = rng.standard_normal(3)
        for name, dtype, shape in LAYOUT_CASES[case]:
            dims = ["time"]
            for k, n in enumerate(shape):
                ds.createDimension(f"{name}{k}", n)
                dims.append(f"{name}{k}")
            values = (rng.standard_normal((nrec, *shape)) * 50).astype(dtype)
            ds.createVariable(name, dtype, tuple(dims))[:] = values
            written[name] = values
            var_dims[name] = tuple(dims[1:])
    layout = record_layout(path)
    raw = path.read_bytes()
    assert layout.version == version
    assert layout.numrecs == nrec
    numrecs = np.frombuffer(raw, layout.numrecs_dtype, 1, layout.numrecs_offset)[0]
    assert numrecs == nrec
    assert set(layout.vars) == set(written)
    for name, values in written.items():
        var = layout.vars[name]
        assert var.shape == values.shape[1:]
        assert layout.dims[name] == var_dims[name]
        assert var.dtype == np.dtype(values.dtype).newbyteorder(">")
        for r in range(nrec):
            start = var.begin + r * layout.recsize
            got = np.frombuffer(raw, var.dtype, values[r].size, start).reshape(var.shape)
            np.testing.assert_array_equal(got, values[r])
    assert len(raw) >= layout.data_end(nrec)
    # The fixed-size variable keeps its raw offset; record variables keep none.
    fd = os.open(path, os.O_RDONLY)
    try:
        _, infos = read_classic_header(fd, path)
    finally:
        os.close(fd)
    assert infos["c"].raw_offset is not None
    assert all(infos[name].raw_offset is None for name in written)


# -- SharedRecordFile on one rank ------------------------------------------------------------


def _define_small(nj: int, ni: int, nk: int):
    def define(ds) -> None:
        ds.createDimension("time", None)
        ds.createDimension("nv", 2)
        ds.createDimension("lev", nk)
        ds.createDimension("lat", nj)
        ds.createDimension("lon", ni)
        ds.createVariable("time", "f8", ("time",))
        ds.createVariable("time_bnds", "f8", ("time", "nv"))
        ds.createVariable("lat", "f8", ("lat",))[:] = np.arange(nj)
        ds.createVariable("a", "f4", ("time", "lat", "lon"))
        ds.createVariable("b", "f8", ("time", "lev", "lat", "lon"))
        ds.createVariable("z", "i2", ("time", "lat"))  # 1-D: the owner's (a zonal mean)

    return define


def _times(record: int, nj: int) -> dict[str, np.ndarray]:
    return {
        "time": 1.5 + record,
        "time_bnds": [record + 1, record + 2],
        "z": np.arange(nj) + record,
    }


def _records_in_file(path: Path) -> int:
    with netCDF4.Dataset(path) as ds:
        return ds.dimensions["time"].size


def test_serial_announces_complete_records_in_order(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    nj, ni, nk = (int(n) for n in rng.integers(2, 7, size=3))
    path = tmp_path / "s.nc"
    comm = MPI.COMM_SELF
    f = SharedRecordFile(path, comm, 0, _define_small(nj, ni, nk), RowDistribution.of(nj, comm))
    assert f.row_variables == ("a", "b")
    a = rng.standard_normal((3, nj, ni))
    b = rng.standard_normal((3, nk, nj, ni))
    for record in (1, 2):
        f.write_rows(record, "b", b[record])
        f.write_rows(record, "a", a[record])
        f.record_done(record, _times(record, nj))
    assert f.poll() == []  # record 0 is missing: nothing can be announced
    assert _records_in_file(path) == 0
    f.write_rows(0, "a", a[0])
    f.write_rows(0, "b", b[0])
    f.record_done(0, _times(0, nj))
    assert _records_in_file(path) == 0  # announced only by poll
    assert f.poll() == [0, 1, 2]
    assert f.close() == 3
    with netCDF4.Dataset(path) as ds:
        np.testing.assert_array_equal(ds["a"][:], a.astype("f4"))
        np.testing.assert_array_equal(ds["b"][:], b)
        np.testing.assert_array_equal(ds["time"][:], [1.5, 2.5, 3.5])
        np.testing.assert_array_equal(ds["time_bnds"][:], [[1, 2], [2, 3], [3, 4]])
        np.testing.assert_array_equal(ds["z"][:], np.arange(nj) + np.arange(3)[:, None])
        np.testing.assert_array_equal(ds["lat"][:], np.arange(nj))
    layout = record_layout(path)
    assert path.stat().st_size == layout.data_end(3)  # the padding of "z" is written too


def test_serial_close_leaves_undeclared_record_out(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    nj, ni, nk = 3, 4, 2
    path = tmp_path / "s.nc"
    comm = MPI.COMM_SELF
    f = SharedRecordFile(path, comm, 0, _define_small(nj, ni, nk), RowDistribution.of(nj, comm))
    a = rng.standard_normal((2, nj, ni))
    f.write_rows(0, "a", a[0])
    f.write_rows(0, "b", np.ones((nk, nj, ni)))
    f.record_done(0, _times(0, nj))
    f.write_rows(1, "a", a[1])  # record 1 never declared done
    assert f.close() == 1
    with netCDF4.Dataset(path) as ds:
        assert ds.dimensions["time"].size == 1
        np.testing.assert_array_equal(ds["a"][:], a[:1].astype("f4"))
    with pytest.raises(ValueError, match="closed"):
        f.poll()


def test_serial_unstructured_rows(tmp_path: Path, rng: np.random.Generator) -> None:
    """``row_axes`` names the row variables and their row axis (cells of a 1-D grid)."""
    ncells, nk = 7, 3

    def define(ds) -> None:
        ds.createDimension("time", None)
        ds.createDimension("lev", nk)
        ds.createDimension("ncells", ncells)
        ds.createVariable("time", "f8", ("time",))
        ds.createVariable("ts", "f4", ("time", "ncells"))
        ds.createVariable("ta", "f8", ("time", "lev", "ncells"))

    path = tmp_path / "u.nc"
    comm = MPI.COMM_SELF
    f = SharedRecordFile(
        path, comm, 0, define, RowDistribution.of(ncells, comm), row_axes={"ts": 0, "ta": -1}
    )
    ts = rng.standard_normal(ncells)
    ta = rng.standard_normal((nk, ncells))
    f.write_rows(0, "ts", ts)
    f.write_rows(0, "ta", ta)
    f.record_done(0, {"time": 0.0})
    assert f.close() == 1
    with netCDF4.Dataset(path) as ds:
        np.testing.assert_array_equal(ds["ts"][0], ts.astype("f4"))
        np.testing.assert_array_equal(ds["ta"][0], ta)


def test_serial_errors_name_the_variable(tmp_path: Path) -> None:
    nj, ni, nk = 4, 3, 2
    comm = MPI.COMM_SELF
    rows = RowDistribution.of(nj, comm)
    f = SharedRecordFile(tmp_path / "e.nc", comm, 0, _define_small(nj, ni, nk), rows)
    with pytest.raises(ValueError, match=r"'b'.*shape \(4, 3\), expected \(2, 4, 3\)"):
        f.write_rows(0, "b", np.zeros((nj, ni)))
    with pytest.raises(ValueError, match="'time' is not a row variable"):
        f.write_rows(0, "time", np.zeros(()))
    f.write_rows(0, "a", np.zeros((nj, ni)))
    with pytest.raises(ValueError, match=r"did not write its rows of \['b'\] for record 0"):
        f.record_done(0, _times(0, nj))
    f.write_rows(0, "a", np.zeros((nj, ni)))
    f.write_rows(0, "b", np.zeros((nk, nj, ni)))
    with pytest.raises(ValueError, match="lacks a value of 'z'"):
        f.record_done(0, {"time": 0.0, "time_bnds": [0, 1]})
    f.record_done(0, _times(0, nj))
    assert f.poll() == [0]
    f.write_rows(0, "a", np.zeros((nj, ni)))
    f.write_rows(0, "b", np.zeros((nk, nj, ni)))
    with pytest.raises(ValueError, match=r"record 0 cannot be declared done \(again\)"):
        f.record_done(0, _times(0, nj))
    with pytest.raises(ValueError, match="record -1 cannot"):
        f.record_done(-1, _times(0, nj))
    f.close()
    with pytest.raises(ValueError, match="row_axes: 'nope' is not a record variable"):
        SharedRecordFile(
            tmp_path / "x.nc", comm, 0, _define_small(nj, ni, nk), rows, row_axes={"nope": 0}
        )


def test_define_writing_records_is_refused_and_leaves_no_file(tmp_path: Path) -> None:
    def define(ds) -> None:
        ds.createDimension("time", None)
        ds.createVariable("time", "f8", ("time",))[0] = 1.0

    path = tmp_path / "d.nc"
    path.write_text("previous")
    comm = MPI.COMM_SELF
    with pytest.raises(ValueError, match="define\\(\\) wrote 1 record"):
        SharedRecordFile(path, comm, 0, define, RowDistribution.of(1, comm))
    assert path.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.nc"]


# -- several ranks under mpiexec -------------------------------------------------------------


def _run_child(args: list[object], ranks: int) -> subprocess.CompletedProcess[str]:
    needs.mpiexec()  # MPIEXEC
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, str(CHILD), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


def _ncdump_values(path: Path, name: str, dtype: str) -> np.ndarray:
    """Flat values of ``name`` as ncdump prints them (round-trip precision)."""
    out = subprocess.run(
        ["ncdump", "-v", name, "-p", "9,17", str(path)], capture_output=True, text=True, check=True
    ).stdout
    body = re.search(rf"^ {re.escape(name)} =(.*?);", out.split("data:", 1)[1], re.S | re.M)
    assert body is not None, out[-500:]
    return np.array([float(v) for v in body.group(1).replace("\n", " ").split(",")], dtype=dtype)


def _expected(case, numrecs: int) -> dict[str, np.ndarray]:
    return {name: full[:numrecs] for name, full in case.data.items()}


def _check_file(path: Path, case, numrecs: int) -> None:
    """netCDF4 and ncdump both read exactly ``numrecs`` records equal to the global arrays."""
    expected = _expected(case, numrecs)
    with netCDF4.Dataset(path) as ds:
        assert ds.data_model == "NETCDF3_64BIT_DATA"
        assert ds.dimensions["time"].size == numrecs
        for name, values in expected.items():
            got = ds[name][:]
            assert not np.ma.is_masked(got)
            np.testing.assert_array_equal(np.ma.getdata(got), values, err_msg=name)
        np.testing.assert_array_equal(ds["time"][:], 6.0 * np.arange(numrecs) + 3)
        np.testing.assert_array_equal(
            ds["time_bnds"][:], 6.0 * np.stack([np.arange(numrecs), np.arange(1, numrecs + 1)], 1)
        )
    header = subprocess.run(["ncdump", "-h", str(path)], capture_output=True, text=True, check=True)
    assert f"time = UNLIMITED ; // ({numrecs} currently)" in header.stdout
    for name, values in expected.items():
        np.testing.assert_array_equal(
            _ncdump_values(path, name, values.dtype.str), values.reshape(-1), err_msg=name
        )
    if shutil.which("cdo"):
        info = subprocess.run(["cdo", "-s", "sinfon", str(path)], capture_output=True, text=True)
        assert info.returncode == 0, info.stderr
        assert re.search(rf"time : {numrecs} steps?", info.stdout), info.stdout


@pytest.mark.parametrize(
    ("ranks", "shape"),
    [(2, None), (3, None), (3, (2, 4, 3))],  # (nj, ni, nk); nj=2 on 3 ranks: one rank has no rows
    ids=["n2", "n3", "n3-empty-rank"],
)
def test_ranks_write_rows_of_one_file(
    tmp_path: Path, rng: np.random.Generator, ranks, shape
) -> None:
    nj, ni, nk = shape or (
        int(rng.integers(ranks, 13)),
        int(rng.integers(2, 9)),
        int(rng.integers(2, 5)),
    )
    nrec = int(rng.integers(3, 7))
    seed = int(rng.integers(2**31))
    owner = int(rng.integers(ranks))
    path = tmp_path / "shared.nc"
    done = _run_child([path, seed, nj, ni, nk, nrec, owner, "normal"], ranks)
    assert done.returncode == 0, done.stdout + done.stderr
    case = _child_module().make_case(seed, nj, ni, nk, nrec)  # the global arrays, rebuilt here
    _check_file(path, case, nrec)


def test_killed_rank_leaves_only_complete_records(tmp_path: Path, rng: np.random.Generator) -> None:
    ranks, nj, ni, nk = 3, int(rng.integers(3, 10)), int(rng.integers(2, 7)), 3
    seed = int(rng.integers(2**31))
    owner = int(rng.integers(ranks))
    victim = int(rng.choice([r for r in range(ranks) if r != owner]))
    path = tmp_path / "crash.nc"
    done = _run_child([path, seed, nj, ni, nk, 4, owner, "crash", victim], ranks)
    assert done.returncode != 0, "the victim's SIGKILL must end the job"
    case = _child_module().make_case(seed, nj, ni, nk, 4)
    _check_file(path, case, 2)
    # The victim's rows of record 2 of "a2" are on disk (the kill came after a partial
    # record), yet no reader sees record 2.
    layout = record_layout(path)
    rows = RowDistribution(nj, ranks, victim)
    info = layout.record_info("a2", 2)
    lo = rows.start * ni
    raw = np.fromfile(path, info.dtype, rows.count * ni, offset=info.raw_offset + lo * 4)
    np.testing.assert_array_equal(raw, case.data["a2"][2, rows.start : rows.stop].reshape(-1))


def test_reader_outside_the_job_sees_only_complete_records(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """Another process reads the file over and over while the servers write it.

    Every snapshot holds some number of records, each equal to the global
    arrays (the bytes of records still being written are never visible).
    """
    needs.mpiexec()  # MPIEXEC
    nj, ni, nk, nrec = 24, 40, 4, 30
    seed = int(rng.integers(2**31))
    case = _child_module().make_case(seed, nj, ni, nk, nrec)
    path = tmp_path / "live.nc"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    args = [path, seed, nj, ni, nk, nrec, 0, "normal"]
    cmd = [str(MPIEXEC), "-n", "2", sys.executable, str(CHILD), *map(str, args)]
    seen = set()
    deadline = time.monotonic() + 180
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        try:
            while proc.poll() is None:
                assert time.monotonic() < deadline, "the writers did not finish in 180 s"
                if not path.exists():
                    continue
                with netCDF4.Dataset(path) as ds:
                    n = ds.dimensions["time"].size
                    for name, full in case.data.items():
                        np.testing.assert_array_equal(ds[name][:n], full[:n], err_msg=name)
                seen.add(n)
            out = proc.stdout.read().decode()
        finally:
            proc.kill()
    assert proc.returncode == 0, out
    print(f"record counts seen while writing: {sorted(seen)}")
    _check_file(path, case, nrec)

"""ioserver core: protocol bytes, parts and geometry, plan, client checks, MPI runs.

The MPI runs start ``mpiexec`` on tests/data/ioserver/iocore_model.py, whose server
ranks record what the core pushes (a recording sink instead of the graph and
writer); the recorded global arrays are compared with the field formulas
evaluated here on the global grid, independently of any decomposition.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import needs
import numpy as np
import pytest

from ensio.ioserver import IOServerError, Report
from ensio.ioserver.client import Client, Transport
from ensio.ioserver.config import DomainDef
from ensio.ioserver.configload import ioserver_from_dict, load_ioserver_config
from ensio.ioserver.parts import (
    assemble_geometry,
    domain_from_message,
    domain_message,
    make_local_domain,
    place,
)
from ensio.ioserver.protocol import (
    HEADER_BYTES,
    MAGIC,
    DType,
    FieldEntry,
    FieldTable,
    Header,
    Kind,
    ProtocolError,
    decode,
    encode,
    format_pairs,
    format_table,
    parse_pairs,
    parse_table,
)
from ensio.ioserver.report import with_server_text
from ensio.ioserver.start import build_plan

HERE = Path(__file__).parent
DATA = HERE / "data" / "ioserver"
CONFIG = DATA / "iocore.yaml"
VENV_BIN = Path(sys.executable).parent
MPIEXEC = VENV_BIN / "mpiexec"
SRC = HERE.parent / "src"
sys.path.insert(0, str(DATA))
import iocore_model as M  # noqa: E402  (the formulas the model program sends)

# --------------------------------------------------------------------------- protocol


def test_header_is_the_c_struct_byte_for_byte():
    payload = np.array([1.5, -2.0, 3.25])
    msg = encode(Header(Kind.FIELD, step=7, a=(1, 2, 3), name="tas_min"), payload)
    expect = struct.pack("=12q32s", MAGIC, 2, 7, 0, 3, 1, 2, 3, 0, 0, 0, 0,
                         b"tas_min") + struct.pack("=3d", 1.5, -2.0, 3.25)
    assert HEADER_BYTES == 128
    assert bytes(msg) == expect
    if sys.byteorder == "little":
        assert bytes(msg[:8]) == b"ENSIOIO1"
    header, data = decode(expect)
    assert header == Header(Kind.FIELD, 7, DType.F64, 3, (1, 2, 3, 0, 0, 0, 0), "tas_min")
    np.testing.assert_array_equal(data, payload)


@pytest.mark.parametrize("kind", list(Kind))
def test_round_trip_every_kind(kind, rng):
    payload = rng.standard_normal(5).astype(np.float32)
    a = tuple(int(x) for x in rng.integers(-10**12, 10**12, 7))
    h, p = decode(encode(Header(kind, step=12, a=a, name="x" * 32), payload))
    assert (h.kind, h.step, h.a, h.name, h.dtype, h.count) == (kind, 12, a, "x" * 32,
                                                               DType.F32, 5)
    np.testing.assert_array_equal(p, payload)
    strided = rng.standard_normal((4, 6)).astype(">f8")[:, ::2]  # big-endian, not contiguous
    np.testing.assert_array_equal(decode(encode(Header(kind), strided))[1], strided.ravel())
    h, p = decode(encode(Header(Kind.ABORT), "rank 3 failed: é"))
    assert h.dtype == DType.TEXT and bytes(p).decode() == "rank 3 failed: é"


def test_decode_refuses_bad_messages():
    good = bytes(encode(Header(Kind.STEP, step=1)))
    with pytest.raises(ProtocolError, match="magic"):
        decode(b"\0" * 8 + good[8:])
    with pytest.raises(ProtocolError, match="payload bytes"):
        decode(good + b"\0" * 8)
    with pytest.raises(ProtocolError, match="shorter"):
        decode(good[:100])
    bad_kind = good[:8] + struct.pack("=q", 99) + good[16:]
    with pytest.raises(ProtocolError, match="bad header"):
        decode(bad_kind)
    with pytest.raises(ProtocolError, match="longer than 32"):
        encode(Header(Kind.FIELD, name="y" * 33), np.zeros(1))
    with pytest.raises(ProtocolError, match="float32 or float64"):
        encode(Header(Kind.FIELD, name="y"), np.zeros(2, dtype=int))


def test_field_table_text_round_trip():
    t = FieldTable(("noleap", "2000-01-01 00:00:00", 3600),
                   {"atm": ("rectilinear", 96, 48, 0), "ocn": ("unstructured", 500, 1, 6)},
                   {"lev": 10}, {"g2": ("atm", None), "g3": ("atm", "lev")},
                   {"tas": FieldEntry("g2", (3, 4), (1,)), "pr": FieldEntry("g2", (), ()),
                    "ta": FieldEntry("g3", (4,), (2, 3))})
    text = format_table(t)
    assert text.splitlines()[0] == "ensio-ioserver 1" and text.splitlines()[-1] == "end"
    assert "calendar noleap 2000-01-01T00:00:00 3600" in text
    assert "field pr g2 - -" in text and "field ta g3 4 2,3" in text
    assert parse_table(text) == t
    assert [t.fields["ta"].is_active(s) for s in range(1, 7)] == [
        False, True, True, True, False, True]
    assert not t.fields["pr"].is_active(2)
    with pytest.raises(ProtocolError, match="line 2"):
        parse_table("ensio-ioserver 1\nfield x\nend\n")


def test_report_text():
    values = {"server_busy_fraction": 0.25, "server_memory_hwm_bytes": 2**40,
              "bytes_written": 123456789, "files_written": 3}
    assert parse_pairs(format_pairs(values)) == {k: float(v) for k, v in values.items()}
    r = with_server_text(Report(1.5, 10, 2), format_pairs(values))
    assert r == Report(1.5, 10, 2, 0.25, 2**40, 123456789, 3)


# --------------------------------------------------------------------------- parts

def _decomp(rng, nj, ni):
    """Random irregular rectangles covering (nj, ni): split rows, then each band's columns."""
    cuts_j = sorted(rng.choice(np.arange(1, nj), size=2, replace=False))
    parts = []
    for j0, j1 in zip([0, *cuts_j], [*cuts_j, nj], strict=True):
        cuts_i = sorted(rng.choice(np.arange(1, ni), size=int(rng.integers(0, 3)), replace=False))
        for i0, i1 in zip([0, *cuts_i], [*cuts_i, ni], strict=True):
            parts.append((j0, j1 - j0, i0, i1 - i0))
    return parts


@pytest.mark.parametrize("kind", ["rectilinear", "curvilinear", "unstructured"])
def test_geometry_assembled_from_random_parts(kind, rng):
    nj, ni = (1, 23) if kind == "unstructured" else (9, 11)
    d = DomainDef("d", kind, ni, nj, 5 if kind == "unstructured" else None)
    jj, ii = np.meshgrid(np.arange(nj), np.arange(ni), indexing="ij")
    glon, glat = 3.0 * ii + 0.1 * jj, -80.0 + 7.0 * jj + 0.01 * ii
    gmask = rng.random((nj, ni)) < 0.8
    garea = 1.0 + rng.random((nj, ni))
    gbnds = rng.random((nj, ni, 5 if kind == "unstructured" else 4))
    rects = [(0, 1, i0, n) for _, _, i0, n in _decomp(rng, 3, ni)] if kind == "unstructured" \
        else _decomp(rng, nj, ni)
    lds = []
    for j0, n_j, i0, n_i in rects:
        sl = (slice(j0, j0 + n_j), slice(i0, i0 + n_i))
        if kind == "rectilinear":
            arrays = {"lon": 3.0 * np.arange(i0, i0 + n_i), "lat": -80.0 + 7.0 * np.arange(
                j0, j0 + n_j), "lon_bounds": None, "lat_bounds": None}
        else:
            arrays = {"lon": glon[sl], "lat": glat[sl], "lon_bounds": gbnds[sl],
                      "lat_bounds": -gbnds[sl]}
            if kind == "unstructured":
                arrays = {k: v[0] for k, v in arrays.items()}
        extra = {"mask": gmask[sl], "area": garea[sl]}
        if kind == "unstructured":
            extra = {k: v[0] for k, v in extra.items()}
        ld = make_local_domain(d, i0, n_i, j0, n_j, **arrays, **extra)
        a, payload = domain_message(ld)
        lds.append(domain_from_message(d, a, payload))  # through the wire format
    g = assemble_geometry(d, lds)
    if kind == "rectilinear":
        np.testing.assert_array_equal(g["lon"], 3.0 * np.arange(ni))
        np.testing.assert_array_equal(g["lat"], -80.0 + 7.0 * np.arange(nj))
        assert g["lon_bounds"] is None
    elif kind == "curvilinear":
        np.testing.assert_array_equal(g["lon"], glon)
        np.testing.assert_array_equal(g["lat_bounds"], -gbnds)
    else:
        np.testing.assert_array_equal(g["lon"], glon[0])
        np.testing.assert_array_equal(g["lon_bounds"], gbnds[0])
    sl = 0 if kind == "unstructured" else slice(None)
    np.testing.assert_array_equal(g["mask"], gmask[sl])
    np.testing.assert_array_equal(g["area"], garea[sl])


def test_uncovered_points_are_masked_and_declarations_checked():
    d = DomainDef("atm", "rectilinear", 4, 3)
    part = make_local_domain(d, 0, 4, 0, 2)
    g = assemble_geometry(d, [part])
    np.testing.assert_array_equal(g["mask"], [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    np.testing.assert_allclose(g["lon"], [45, 135, 225, 315])  # regular default
    with pytest.raises(ValueError, match="outside 4 x 3"):
        make_local_domain(d, 2, 3, 0, 1)
    with pytest.raises(ValueError, match="mask has shape"):
        make_local_domain(d, 0, 2, 0, 2, mask=np.ones((2, 3)))
    with pytest.raises(ValueError, match="both lon and lat"):
        make_local_domain(d, 0, 2, 0, 2, lon=np.zeros(2))
    with pytest.raises(ValueError, match="no lon/lat"):
        assemble_geometry(DomainDef("c", "curvilinear", 2, 2), [
            make_local_domain(DomainDef("c", "curvilinear", 2, 2), 0, 2, 0, 2)])
    target = np.full((2, 3, 4), np.nan)
    place(target, d, part.part, np.arange(16.0))
    np.testing.assert_array_equal(target[:, :2].reshape(-1), np.arange(16.0))
    assert np.isnan(target[:, 2]).all()


# --------------------------------------------------------------------------- plan

def _cfg(files):
    return ioserver_from_dict({
        "domains": [{"id": "d", "type": "rectilinear", "ni_glo": 10, "nj_glo": 10}],
        "grids": [{"id": "g", "domain": "d"}],
        "fields": [{"id": "a", "grid": "g"}, {"id": "b", "grid": "g"}],
        "files": files})


def test_plan_balances_files_largest_first():
    # per hour: f1 = 4 fields x 400 B = 1600, f2 = 800, f3 = 800 (2h of 1600), f4 = 400
    files = [
        {"id": "f4", "name": "f4", "output_freq": "1h", "fields": [{"field_ref": "a"}]},
        {"id": "f1", "name": "f1", "output_freq": "1h", "fields": [
            {"field_ref": "a", "name": n} for n in ("x", "y", "z", "w")]},
        {"id": "f2", "name": "f2", "output_freq": "1h", "fields": [
            {"field_ref": "b", "name": n} for n in ("x", "y")]},
        {"id": "f3", "name": "f3", "output_freq": "2h", "fields": [
            {"field_ref": "b", "name": n} for n in ("x", "y", "z", "w")]},
    ]
    cfg = _cfg(files)

    def periods(cfg, files):  # a server needs a field iff one of its files refers to it
        used = {fd.field_ref for f in cfg.files if f.id in files for fd in f.fields}
        return {s: (1,) if s in used else () for s in cfg.sources}

    plan = build_plan(cfg, (5, 7), periods)
    # f1 -> 5 (1600); f2 -> 7 (800); f3 -> 7 (1600); f4: tie 1600/1600 -> lowest rank 5
    assert plan.files == {5: ("f4", "f1"), 7: ("f2", "f3")}  # in config order
    assert plan.table.fields["a"].servers == (5,)
    assert plan.table.fields["b"].servers == (7,)
    assert plan.table.calendar == ("standard", "2000-01-01 00:00:00", 3600)


# --------------------------------------------------------------------------- client checks

class _Fake(Transport):
    def __init__(self):
        self.periods = {"tas": (1,), "pr": (2,), "ta": (1,)}
        self.sent = []

    def define(self, domains):
        self.domains = domains

    def step(self, step):
        self.sent.append(("step", step))

    def send(self, field_id, step, data):
        self.sent.append((field_id, step, data.shape))

    def close(self, last_step):
        return Report()

    def abort(self, reason):
        self.sent.append(("abort", reason))


def test_client_checks_name_field_and_rank():
    cfg = load_ioserver_config(CONFIG)
    fake = _Fake()
    c = Client(cfg, None, 5, fake)
    with pytest.raises(IOServerError, match="model rank 5: unknown domain 'ocean'"):
        c.set_domain("ocean", ibegin=0, ni=1)
    c.set_domain("atm", ibegin=2, ni=3, jbegin=1, nj=2)
    with pytest.raises(IOServerError, match="model rank 5: update_timestep"):
        c.update_timestep(1)
    c.close_definition()
    with pytest.raises(IOServerError, match=r"model rank 5: is_active\('tas'\) needs a step"):
        c.is_active("tas")
    assert c.is_active("tas", 1)
    with pytest.raises(IOServerError, match="before the first update_timestep"):
        c.send("tas", np.zeros((2, 3)))
    c.update_timestep(1)
    with pytest.raises(IOServerError, match="model rank 5: unknown field 'tsa'"):
        c.send("tsa", np.zeros((2, 3)))
    with pytest.raises(IOServerError, match="field 'tas_c' is computed"):
        c.send("tas_c", np.zeros((2, 3)))
    with pytest.raises(IOServerError, match=r"model rank 5: field 'tas' has shape \(3, 2\), "
                                            r"expected \(2, 3\)"):
        c.send("tas", np.zeros((3, 2)))
    with pytest.raises(IOServerError, match=r"field 'ta' has shape \(2, 3\), expected \(3, 2, 3\)"):
        c.send("ta", np.zeros((2, 3)))
    with pytest.raises(IOServerError, match="field 'tas' has dtype int64"):
        c.send("tas", np.zeros((2, 3), dtype=np.int64))
    c.send("tas", np.zeros(6, dtype=np.float32))  # flat is accepted
    c.send("tas", np.zeros((2, 3), dtype=">f8"))  # and any byte order
    c.send("pr", np.zeros((2, 3)))  # not active at step 1: skipped
    assert not c.is_active("pr") and c.is_active("pr", 4) and c.is_active("tas")
    with pytest.raises(IOServerError, match="field 'tas_c' is computed"):
        c.is_active("tas_c")
    with pytest.raises(IOServerError, match="update_timestep\\(1\\) after step 1"):
        c.update_timestep(1)
    assert fake.sent == [("step", 1), ("tas", 1, (2, 3)), ("tas", 1, (2, 3))]
    with pytest.raises(IOServerError), c:
        raise IOServerError("x")
    assert fake.sent[-1] == ("abort", "model rank 5 failed: IOServerError: x")
    with pytest.raises(IOServerError, match=r"model rank 5: send\(\) after close\(\)"):
        c.send("tas", np.zeros((2, 3)))


# --------------------------------------------------------------------------- MPI runs

def _run(nprocs, out, scenario="ok", extra=(), mode_args=(), timeout=180):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    cmd = [str(MPIEXEC), "-n", str(nprocs), sys.executable, str(DATA / "iocore_model.py"),
           str(CONFIG), str(out), scenario, *extra, *mode_args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _expected(field, step):
    j, i = np.meshgrid(np.arange(M.NJ), np.arange(M.NI), indexing="ij")
    if field == "tas":
        return M.tas(step, j, i).astype(np.float32).astype(np.float64)
    if field == "pr":
        return M.pr(step, j, i)
    return M.ta(step, np.arange(M.NK)[:, None, None], j, i)


def _check_records(out, server_ranks, steps=M.STEPS):
    j, i = np.meshgrid(np.arange(M.NJ), np.arange(M.NI), indexing="ij")
    files = []
    for r in server_ranks:
        rec = pickle.loads((out / f"record-{r}.pkl").read_bytes())
        assert rec["closed"] and rec["finish"] == steps
        assert rec["advance"] == list(range(1, steps + 1))
        want = {(f, s) for s in range(1, steps + 1) for f in ("tas", "ta")} | {
            ("pr", s) for s in range(2, steps + 1, 2)}
        assert set(rec["push"]) == want
        for (f, s), data in rec["push"].items():
            np.testing.assert_array_equal(data, _expected(f, s), err_msg=f"{f} step {s}")
        g = rec["geometry"]["atm"]
        np.testing.assert_array_equal(g["mask"], M.mask(j, i))
        np.testing.assert_array_equal(g["lon"], M.lon(np.arange(M.NI)))
        np.testing.assert_array_equal(g["lat"], M.lat(np.arange(M.NJ)))
        files += rec["files"]
    assert sorted(files) == ["surface", "upper"]


@pytest.mark.parametrize("nprocs,servers", [(3, 1), (4, 1), (4, 2)])
def test_server_assembles_global_fields(tmp_path, nprocs, servers):
    res = _run(nprocs, tmp_path, extra=["--set", f"ioserver.servers={servers}"])
    assert res.returncode == 0, res.stderr
    _check_records(tmp_path, range(nprocs - servers, nprocs))
    reports = pickle.loads((tmp_path / "reports.pkl").read_bytes())
    assert len(reports) == nprocs - servers
    assert all(r.files_written == servers and r.bytes_written == 1000 * servers
               for r in reports)
    # every FIELD/STEP/DOMAIN/DEFINED/CLOSE message, to each server
    per_rank = servers * (1 + 1 + 2 * M.STEPS + M.STEPS // 2 + M.STEPS + 1)
    assert all(r.messages == per_rank for r in reports)


def test_a_rank_without_a_part_is_not_waited_for(tmp_path):
    res = _run(4, tmp_path, "empty")
    assert res.returncode == 0, res.stderr
    _check_records(tmp_path, (3,))


def test_a_failing_server_ends_the_job_and_the_other_closes_its_files(tmp_path):
    res = _run(4, tmp_path, "sink_fails", extra=["--set", "ioserver.servers=2"])
    assert res.returncode != 0
    assert "ensio ioserver: server rank 3 failed: OSError: [Errno 28] No space left" in res.stderr
    assert res.stderr.count("ensio ioserver:") == 1
    failed = pickle.loads((tmp_path / "record-3.pkl").read_bytes())
    assert failed["closed"] and failed["finish"] is None and failed["advance"] == [1, 2]
    other = pickle.loads((tmp_path / "record-2.pkl").read_bytes())  # done or stopped
    assert other["closed"]


def test_a_killed_model_rank_ends_the_job(tmp_path):
    # mpiexec tears the job down (no rank can report it); the point: no hang, non-zero
    res = _run(3, tmp_path, "kill")
    assert res.returncode != 0
    record = tmp_path / "record-2.pkl"  # written atomically, if the server got so far
    rec = pickle.loads(record.read_bytes()) if record.exists() else {"push": {}}
    for (f, s), data in rec["push"].items():
        np.testing.assert_array_equal(data, _expected(f, s))


def test_back_pressure_gives_the_same_arrays(tmp_path):
    res = _run(4, tmp_path, extra=["--set", "ioserver.servers=2",
                                   "--set", "ioserver.server_buffer_mb=0.00001",
                                   "--set", "ioserver.client_buffer_mb=0.0001"])
    assert res.returncode == 0, res.stderr
    _check_records(tmp_path, (2, 3))


@pytest.mark.parametrize("budget_mb", [0.01, 0.3])
def test_server_memory_stays_bounded(budget_mb):
    # a (field, step) global array is 800 kB (a, b) or 160 kB (c); one step of the
    # three is 1.76 MB: over budget a server takes only what the oldest one waits for
    env = dict(os.environ, PYTHONPATH=str(SRC))
    cmd = [str(MPIEXEC), "-n", "5", sys.executable, str(DATA / "pressure.py"),
           str(DATA / "pressure.yaml"), f"ioserver.server_buffer_mb={budget_mb}",
           "ioserver.client_buffer_mb=0.05"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines() if line.startswith("REPORT")]
    assert len(rows) == 3
    for _, _, hwm, pushes in rows:
        assert int(pushes) == 2 * 2 * 30  # two servers, two fields each, 30 steps
        assert int(hwm) <= budget_mb * 2**20 + 1_760_000


def test_sync_mode_gives_the_same_arrays(tmp_path):
    res = _run(3, tmp_path, extra=["--set", "ioserver.mode=sync"])
    assert res.returncode == 0, res.stderr
    _check_records(tmp_path, (0,))


def test_mpmd_server_processes(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    prog = [sys.executable, str(DATA / "iocore_model.py"), str(CONFIG), str(tmp_path), "ok"]
    cmd = [str(MPIEXEC), "-n", "2", *prog, ":", "-n", "1", *prog, "--server"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    _check_records(tmp_path, (2,))


@pytest.mark.parametrize("scenario,message", [
    ("bad_field", "ensio ioserver: model rank 1: unknown field 'nosuch' (step 3)"),
    ("bad_shape", "ensio ioserver: model rank 1: field 'tas' step 3: part of 24 values, "
                  "expected 21"),
    ("raise", "ensio ioserver: model rank 1 failed: RuntimeError: boom in the model"),
])
def test_failures_end_the_job_naming_the_rank(tmp_path, scenario, message):
    res = _run(3, tmp_path, scenario)
    assert res.returncode != 0
    assert message in res.stderr
    record = tmp_path / "record-2.pkl"
    if scenario == "raise" and record.exists():  # the sink existed: closed, complete steps
        rec = pickle.loads(record.read_bytes())
        assert rec["closed"] and rec["finish"] is None
        assert {s for _, s in rec["push"]} <= {1, 2, 3, 4}
        for (f, s), data in rec["push"].items():
            np.testing.assert_array_equal(data, _expected(f, s))


def test_mpmd_cli_writes_the_same_files_as_sync(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    prog = [sys.executable, str(DATA / "realmodel.py"), str(CONFIG)]
    ensio = [str(VENV_BIN / "ensio"), "ioserver", str(CONFIG), "--set",
             f"ioserver.output_dir={tmp_path / 'server'}"]
    res = subprocess.run([str(MPIEXEC), "-n", "2", *prog, str(tmp_path / "server"), ":",
                          "-n", "1", *ensio], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    for mode in ("sync", "attached"):
        res = subprocess.run([str(MPIEXEC), "-n", "2", *prog, str(tmp_path / mode),
                              f"ioserver.mode={mode}"], env=env, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr
    import netCDF4

    for path in sorted((tmp_path / "server").glob("*.nc")):
        for mode in ("sync", "attached"):
            with netCDF4.Dataset(path) as a, netCDF4.Dataset(tmp_path / mode / path.name) as b:
                for name, var in a.variables.items():
                    np.testing.assert_array_equal(var[:], b.variables[name][:],
                                                  err_msg=f"{mode} {path.name} {name}")


# --------------------------------------------------------------------------- server core, no MPI

class _FakeComm:
    """Enough of an MPI communicator for ServerCore._handle: records the error sends."""

    rank, size = 2, 3

    def __init__(self):
        self.errors = []

    def Isend(self, buf, dest, tag):  # noqa: N802  (the mpi4py name)
        self.errors.append((dest, tag, bytes(buf[0]).decode()))
        return None


class _Calls:
    nbytes = 1000

    def __init__(self, cfg, files, geometry, out_dir, history):
        self.calls = [("new", tuple(files), geometry["atm"].mask.copy())]

    def push(self, f, s, data):
        self.calls.append(("push", f, s, data.copy()))

    def advance(self, s):
        self.calls.append(("advance", s))

    def finish(self, s):
        self.calls.append(("finish", s))

    def close(self):
        self.calls.append(("close",))


def _core():
    from ensio.ioserver.server import ServerCore

    cfg = load_ioserver_config(CONFIG)
    comm = _FakeComm()
    core = ServerCore(cfg, comm, (0, 1), ("surface",), {"tas", "pr"}, _Calls, Path("."), "h")
    d = cfg.domains["atm"]
    # rank 0: rows 0-1 with a mask; rank 1: rows 2-4; both columns 0-6
    for rank, (j0, nj) in ((0, (0, 2)), (1, (2, 3))):
        mask = np.ones((nj, 7), bool)
        mask[0, 0] = rank == 1
        ld = make_local_domain(d, 0, 7, j0, nj, mask=mask)
        a, payload = domain_message(ld)
        core._handle(rank, encode(Header(Kind.DOMAIN, a=a, name="atm"), payload))
    return core, comm


def _field(step, rank, values, name="tas"):
    return encode(Header(Kind.FIELD, step=step, name=name), np.asarray(values, np.float64))


def test_core_assembles_and_advances_in_order():
    from ensio.ioserver.server import ServerAbort

    core, comm = _core()
    core._handle(0, encode(Header(Kind.DEFINED, a=(1,))))
    core._handle(0, encode(Header(Kind.STEP, step=1)))
    core._handle(0, _field(1, 0, np.arange(14.0)))  # before rank 1 defined: held
    assert core.sink is None and core.held == 5 * 7 * 8
    core._handle(1, encode(Header(Kind.DEFINED, a=(1,))))
    calls = core.sink.calls
    assert calls[0][1] == ("surface",) and not calls[0][2][0, 0] and calls[0][2].sum() == 34
    core._handle(1, encode(Header(Kind.STEP, step=1)))
    core._handle(1, _field(1, 1, 100 + np.arange(21.0)))
    assert calls[1][:3] == ("push", "tas", 1)
    np.testing.assert_array_equal(calls[1][3].reshape(-1), np.r_[np.arange(14.0),
                                                                 100 + np.arange(21.0)])
    with pytest.raises(ServerAbort, match="model rank 1: field 'tas' sent twice at step 1"):
        core._handle(1, _field(1, 1, np.zeros(21)))  # after its (field, step) was pushed
    assert [e[:2] for e in comm.errors] == [(1, 7704)]
    core._handle(0, encode(Header(Kind.STEP, step=2)))
    assert calls[-1][0] == "push"  # rank 1 is still in step 1: no advance yet
    core._handle(1, encode(Header(Kind.STEP, step=2)))
    assert calls[-1] == ("advance", 1)
    core._handle(0, _field(2, 0, np.zeros(14)))
    core._handle(0, encode(Header(Kind.CLOSE, step=2)))
    with pytest.raises(ServerAbort, match=r"field 'tas' step 2: model ranks \[1\] went on"):
        core._handle(1, encode(Header(Kind.CLOSE, step=2)))
    assert len(comm.errors) == 1 and core.hwm == 1000  # sink bytes after a push > one field


@pytest.mark.parametrize("rank,message,expect", [
    (1, _field(1, 1, np.zeros(20)), "model rank 1: field 'tas' step 1: part of 20 values, "
                                    "expected 21"),
    (0, _field(1, 0, np.zeros(14), "nope"), "model rank 0: unknown field 'nope' (step 1)"),
    (0, _field(1, 0, np.zeros(14), "tas_c"), "model rank 0: field computed on the servers"),
    (0, _field(1, 0, np.zeros(42), "ta"), "model rank 0: field 'ta' is not sent to server"),
    (0, encode(Header(Kind.STEP, step=0)), "model rank 0: step 0 after step 0"),
    (0, _field(2, 0, np.zeros(14)), "model rank 0: field 'tas' for step 2 during its step 0"),
    (1, b"\0" * 128, "model rank 1: bad magic"),
])
def test_core_errors_name_field_and_rank(rank, message, expect):
    from ensio.ioserver.server import ServerAbort

    core, comm = _core()
    for r in (0, 1):
        core._handle(r, encode(Header(Kind.DEFINED, a=(1,))))
    with pytest.raises(ServerAbort) as info:
        core._handle(rank, np.frombuffer(bytes(message), np.uint8))
    assert str(info.value).startswith(expect)
    if "failed" not in expect:  # the rank at fault is told (tag 7704)
        assert comm.errors == [(rank, 7704, str(info.value))]
    core.close_files()
    assert core.sink is None


def test_a_failed_rank_is_drained_up_to_its_step_then_the_run_ends():
    """ABORT of rank 1 during its step 3: the steps before it are still written once
    rank 0's messages for them arrive; nothing of step 3 or later is."""
    core, _ = _core()
    for r in (0, 1):
        core._handle(r, encode(Header(Kind.DEFINED, a=(1,))))
    for step in (1, 2, 3):
        core._handle(1, encode(Header(Kind.STEP, step=step)))
        if step < 3:
            core._handle(1, _field(step, 1, np.zeros(21)))
    core._handle(1, encode(Header(Kind.ABORT), "model rank 1 failed: ValueError: x"))
    assert core.failures == ["model rank 1 failed: ValueError: x"] and not core._drained()
    for step in (1, 2, 3):
        core._handle(0, encode(Header(Kind.STEP, step=step)))
        core._handle(0, _field(step, 0, np.zeros(14)))
    assert core._drained()
    advances = [c[1] for c in core.sink.calls if c[0] == "advance"]
    assert advances and max(advances) == 2
    assert {c[2] for c in core.sink.calls if c[0] == "push"} == {1, 2}


# --------------------------------------------------------------------------- the C client

CMODEL = HERE / "data" / "ioclient" / "model_c.c"


@needs.mark(needs.venv_tool, "mpicc")
def test_c_model_with_python_servers(tmp_path):
    from ensio.ioserver.build import build_client

    r = build_client(tmp_path / "prefix")
    exe = tmp_path / "model_c"
    subprocess.run([str(r.mpicc), str(CMODEL), "-o", str(exe), *r.c_flags.split()],
                   check=True, timeout=120)
    env = dict(os.environ, PYTHONPATH=str(SRC))
    out = tmp_path / "out"
    cmd = [str(MPIEXEC), "-n", "2", str(exe), "normal", ":", "-n", "2", sys.executable,
           str(DATA / "cserver.py"), str(DATA / "cmodel.yaml"), str(out)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    reports = [line.split() for line in res.stdout.splitlines() if line.startswith("REPORT")]
    # REPORT rank bytes_sent busy hwm bytes_written files_written blocked (2 recorders)
    assert len(reports) == 2 and all(x[5:7] == ["2000", "2"] for x in reports)
    recs = {r: pickle.loads((out / f"record-{r}.pkl").read_bytes()) for r in (2, 3)}
    pushed = {k: v for rec in recs.values() for k, v in rec["push"].items()}
    assert sorted(pushed) == sorted(
        [("tas", s) for s in range(1, 5)] + [("sst", s) for s in range(1, 5)]
        + [("ta", 2), ("ta", 4), ("cu", 3), ("cu", 4)])
    j, i = np.meshgrid(np.arange(6.0), np.arange(8.0), indexing="ij")
    k = np.arange(3.0)[:, None, None]
    oj, oi = np.meshgrid(np.arange(3.0), np.arange(4.0), indexing="ij")
    for (f, s), data in pushed.items():
        if f == "tas":
            want = s * 1000 + j * 10 + i + 0.25
        elif f == "ta":
            want = np.float32(0.5 + s * 1000 + k * 100 + j * 10 + i + 0.25)
        elif f == "cu":
            want = s * 1000 + np.arange(10.0) + 0.75
        else:
            want = s * 1000 + oj * 10 + oi + 0.125
        np.testing.assert_array_equal(data, want, err_msg=f"{f} step {s}")
    geo = recs[2]["geometry"]
    np.testing.assert_array_equal(geo["atm"]["mask"], (i + j) % 5 != 0)
    np.testing.assert_array_equal(geo["atm"]["area"], 1 + i + 10 * j)
    np.testing.assert_array_equal(geo["ocn"]["lon"], 10 * oi + oj)
    np.testing.assert_array_equal(geo["cells"]["lon"], 36.0 * np.arange(10))


def test_with_missing_masks_points_and_missing_values():
    from ensio.ioserver.pipeline import with_missing

    data = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    mask = np.array([[True, False, True], [True, True, False]])
    out = with_missing(data, mask, missing_value=4.0)
    want = np.arange(12.0).reshape(2, 2, 3)
    want[:, ~mask] = np.nan
    want[want == 4.0] = np.nan
    assert out.dtype == np.float64 and data[0, 1, 1] == 4.0  # the input is not changed
    np.testing.assert_array_equal(out, want)


def test_core_under_budget_does_not_wait_for_a_rank_that_went_on():
    from ensio.ioserver.server import ServerAbort

    core, _ = _core()
    core.limit = 0  # every held field is over the budget
    for r in (0, 1):
        core._handle(r, encode(Header(Kind.DEFINED, a=(1,))))
        core._handle(r, encode(Header(Kind.STEP, step=1)))
    core._handle(0, _field(1, 0, np.zeros(14)))
    assert core._waiting_for() == [1]
    core._handle(1, encode(Header(Kind.STEP, step=2)))  # rank 0 is still in step 1
    with pytest.raises(ServerAbort, match=r"field 'tas' step 1: model ranks \[1\] went on"):
        core._waiting_for()


def test_missing_value_is_recognised_in_the_senders_precision():
    from ensio.ioserver.pipeline import with_missing

    data = np.array([[1.0, 1e20, 3.0]], dtype=np.float32)  # float32(1e20) != 1e20
    out = with_missing(data, np.array([[True, True, False]]), 1e20)
    np.testing.assert_array_equal(np.isnan(out), [[False, True, True]])
    assert out.dtype == np.float64 and out[0, 0] == 1.0

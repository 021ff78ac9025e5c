"""C client library and Fortran module of the I/O server (ensio.ioserver.csrc).

The library is built into a temporary prefix with ``build_client`` (the command
``ensio ioclient build``), the test models tests/data/ioclient/model_c.c and
model_f.f90 are compiled against it, and each runs MPMD (2 model ranks : 2 server
ranks) against the stub server below (``python THIS_FILE --stub OUT MODE``). The stub
speaks the server side of the protocol (role 1, field table, report) and checks every
message it receives: magic, kinds and their order, dtypes, sizes, domain geometry and
field values against its own numpy evaluation of the models' formula, the set of
(field, step) messages the field table asks for, and the CLOSE counters against the
bytes it received. The real server replaces the stub once it exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import numpy as np
import pytest

from ensio.cli.main import main as cli_main
from ensio.ioserver.build import BuildError, build_client

DATA = Path(__file__).parent / "data" / "ioclient"
BIN = Path(sys.executable).parent
SRC = Path(__file__).resolve().parents[1] / "src"
MAGIC = 0x314F494F49534E45
NI, NJ, NK, NC, OI, OJ, NSTEPS = 8, 6, 3, 10, 4, 3, 4
FIELDS = {"tas": ("atm2d", 0), "ta": ("atm3d", 1), "cu": ("cells1d", 0), "pr": ("atm2d", 0),
          "sst": ("ocn2d", 0)}
DOMAIN_OF = {"atm2d": "atm", "atm3d": "atm", "cells1d": "cells", "ocn2d": "ocn"}
REPORT = {"server_busy_fraction": 0.25, "server_memory_hwm_bytes": 123456,
          "bytes_written": 7890, "files_written": 3}

pytestmark = [needs.tools_mark("gfortran"), needs.mark(needs.venv_tool, "mpicc")]


# ----------------------------------------------------------------------------- the stub server

def _servers_of(field: str, servers: list[int]) -> list[int]:
    return {"tas": servers, "ta": servers[:1], "cu": servers[-1:], "pr": [],
            "sst": servers[-1:]}[field]


PERIODS = {"tas": (1,), "ta": (2,), "cu": (3, 4), "pr": (), "sst": (1,)}


def _table(servers: list[int]) -> str:
    lines = ["ensio-ioserver 1", "calendar standard 2000-01-01T00:00:00 3600",
             f"domain atm rectilinear {NI} {NJ} 0", f"domain cells unstructured {NC} 1 3",
             f"domain ocn curvilinear {OI} {OJ} 4", f"axis lev {NK}", "grid atm2d atm -",
             "grid atm3d atm lev", "grid cells1d cells -", "grid ocn2d ocn -"]
    for name, (grid, _) in FIELDS.items():
        srv = ",".join(map(str, _servers_of(name, servers))) or "-"
        per = ",".join(map(str, PERIODS[name])) or "-"
        lines.append(f"field {name} {grid} {srv} {per}")
    return "\n".join([*lines, "end", ""])


def _expected_domain(name: str, a: np.ndarray) -> tuple[int, np.ndarray]:
    """(flags, payload) the models send for their part a = [ibegin, ni, jbegin, nj, ...]."""
    ib, ni, jb, nj = (int(x) for x in a[:4])
    i, j = np.arange(ib, ib + ni, dtype=float), np.arange(jb, jb + nj, dtype=float)
    if name == "atm":
        lon, lat = i * 45.0, -75.0 + j * 30.0
        lonb = np.stack([lon - 22.5, lon + 22.5], axis=1)
        latb = np.stack([lat - 15.0, lat + 15.0], axis=1)
        mask = ((i[None, :] + j[:, None]) % 5 != 0).astype(float)
        area = 1.0 + i[None, :] + 10.0 * j[:, None]
        return 15, np.concatenate([lon, lat, lonb.ravel(), latb.ravel(), mask.ravel(),
                                   area.ravel()])
    if name == "ocn":  # curvilinear: (nj, ni) coordinates, (nj, ni, 4) bounds, no mask
        lon = 10.0 * i[None, :] + j[:, None]
        lat = 20.0 * j[:, None] - i[None, :]
        lonb = lon[..., None] + np.array([-0.5, 0.5, 0.5, -0.5])
        latb = lat[..., None] + np.array([-0.5, -0.5, 0.5, 0.5])
        area = 100.0 + i[None, :] + j[:, None]
        return 11, np.concatenate([lon.ravel(), lat.ravel(), lonb.ravel(), latb.ravel(),
                                   area.ravel()])
    lon, lat = i * 36.0, 0.5 * i - 2.0
    lonb = lon[:, None] + np.array([-1.0, 0.0, 1.0])
    latb = lat[:, None] + np.array([-1.0, 1.0, -1.0])
    return 3, np.concatenate([lon, lat, lonb.ravel(), latb.ravel()])


def _expected_field(name: str, step: int, part: np.ndarray) -> np.ndarray:
    """The models' formula for field ``name`` at ``step`` on a domain part, C order."""
    ib, ni, jb, nj = (int(x) for x in part[:4])
    i = np.arange(ib, ib + ni, dtype=float)
    if name == "cu":
        return step * 1000.0 + i + 0.75
    j = np.arange(jb, jb + nj, dtype=float)[:, None]
    if name == "tas":
        return (step * 1000.0 + j * 10.0 + i + 0.25).ravel()
    if name == "sst":
        return (step * 1000.0 + j * 10.0 + i + 0.125).ravel()
    k = np.arange(NK, dtype=float)[:, None, None]
    return (0.5 + step * 1000.0 + k * 100.0 + j * 10.0 + i + 0.25).astype(np.float32).ravel()


class _Client:
    """What the stub learnt from one model rank."""

    def __init__(self) -> None:
        self.domains: dict[str, np.ndarray] = {}
        self.defined = self.closed = False
        self.step = 0
        self.steps: list[int] = []
        self.fields: list[tuple[str, int]] = []
        self.nbytes = self.messages = 0
        self.close_a: list[int] = []
        self.aborted: str | None = None


def _check(c: _Client, rank: int, buf: bytes, problems: list[str]) -> None:
    """Decode one message of model rank ``rank`` and record what is wrong with it."""
    h = np.frombuffer(buf[:96], dtype=np.int64)
    name = buf[96:128].split(b"\0")[0].decode()
    magic, kind, step, dtype, count, a = h[0], h[1], h[2], h[3], h[4], h[5:12]
    bad = problems.append
    if magic != MAGIC or (sys.byteorder == "little" and buf[:8] != b"ENSIOIO1"):
        bad(f"rank {rank}: bad magic {magic:#x}")
        return
    payload = buf[128:]
    if c.closed:
        bad(f"rank {rank}: message of kind {kind} after CLOSE")
    if kind == 1:  # DOMAIN
        if c.defined or name not in ("atm", "cells", "ocn") or name in c.domains or dtype:
            bad(f"rank {rank}: unexpected DOMAIN {name!r} (dtype {dtype})")
            return
        flags, want = _expected_domain(name, a)
        got = np.frombuffer(payload, dtype=np.float64)
        if a[5] != flags or count != want.size or not np.array_equal(got, want):
            bad(f"rank {rank}: DOMAIN {name} part {a.tolist()} flags {a[5]}: payload differs")
        if a[4] != {"atm": 0, "cells": 3, "ocn": 4}[name]:
            bad(f"rank {rank}: DOMAIN {name} nvertex {a[4]}")
        c.domains[name] = a.copy()
    elif kind == 6:  # DEFINED
        if c.defined or a[0] != len(c.domains) or len(c.domains) != 3:
            bad(f"rank {rank}: DEFINED a[0]={a[0]} after {len(c.domains)} domains")
        c.defined = True
    elif kind == 3:  # STEP
        if not c.defined or step <= c.step or count or payload:
            bad(f"rank {rank}: STEP {step} after step {c.step} (defined {c.defined})")
        c.step = int(step)
        c.steps.append(c.step)
    elif kind == 2:  # FIELD
        if name not in FIELDS or step != c.step or dtype != FIELDS[name][1]:
            bad(f"rank {rank}: FIELD {name!r} step {step} dtype {dtype} at step {c.step}")
            return
        want = _expected_field(name, int(step), c.domains[DOMAIN_OF[FIELDS[name][0]]])
        got = np.frombuffer(payload, dtype=np.float32 if dtype == 1 else np.float64)
        if count != want.size or not np.array_equal(got, want):
            bad(f"rank {rank}: FIELD {name} step {step}: {count} values differ from the formula")
        c.fields.append((name, int(step)))
    elif kind == 4:  # CLOSE
        c.closed = True
        c.close_a = [int(x) for x in a[:3]]
    elif kind == 5:  # ABORT
        c.closed = True
        c.aborted = payload.decode()
        if dtype != 3 or count != len(payload):
            bad(f"rank {rank}: ABORT dtype {dtype} count {count} for {len(payload)} bytes")
    else:
        bad(f"rank {rank}: unknown kind {kind}")


def _receive(io, models: list[int], me: int, servers: list[int], mode: str,
             problems: list[str]) -> dict[int, _Client]:
    from mpi4py import MPI

    clients = {m: _Client() for m in models}
    while not all(c.closed for c in clients.values()):
        st = MPI.Status()
        io.Probe(MPI.ANY_SOURCE, 7701, st)
        buf = bytearray(st.Get_count(MPI.BYTE))
        io.Recv([buf, MPI.BYTE], st.Get_source(), 7701)
        c = clients[st.Get_source()]
        c.nbytes += len(buf)
        c.messages += 1
        _check(c, st.Get_source(), bytes(buf), problems)
        if buf[8] == 5:  # ABORT: the verdict the aborting rank waits for (as the server)
            io.Send([b"files closed", MPI.CHAR], st.Get_source(), 7704)
        if mode == "server_error" and me == servers[0] and st.Get_source() == models[0] \
                and c.steps[-1:] == [2] and buf[8] == 3:
            msg = f"field 'tas' of rank {models[0]} rejected by the stub".encode()
            io.Send([msg, MPI.CHAR], models[0], 7704)
    for name, (ni_glo, nj_glo) in {"atm": (NI, NJ), "cells": (NC, 1), "ocn": (OI, OJ)}.items():
        cover = np.zeros((nj_glo, ni_glo), dtype=int)
        for c in clients.values():
            if name in c.domains:
                ib, ni, jb, nj = (int(x) for x in c.domains[name][:4])
                cover[jb:jb + nj, ib:ib + ni] += 1
        if not (cover == 1).all():
            problems.append(f"the parts of domain {name} do not tile it: {cover.tolist()}")
    for m, c in clients.items():
        want = sorted((f, s) for f in FIELDS for s in range(1, NSTEPS + 1)
                      if me in _servers_of(f, servers) and any(s % p == 0 for p in PERIODS[f]))
        if mode in ("server_error", "abort") and m == models[0]:
            continue
        if sorted(c.fields) != want or c.steps != list(range(1, NSTEPS + 1)):
            problems.append(f"rank {m}: received {sorted(c.fields)} steps {c.steps}, "
                            f"the table asks for {want}")
    return clients


def _stub(out: str, mode: str) -> int:
    """The server side of the protocol, checking everything it receives."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    roles = np.empty(world.size, dtype=np.intc)  # MPI_INT, as the C client's MPI_Allgather
    world.Allgather(np.array([1], dtype=np.intc), roles)
    if (roles & 2).any():  # a rank's setup failed: its reason reaches everyone, all exit 2
        io, st = world.Dup(), MPI.Status()
        io.Probe(int(np.flatnonzero(roles & 2)[0]), 7702, st)
        io.Recv([bytearray(st.Get_count(MPI.CHAR)), MPI.CHAR], st.Get_source(), 7702)
        world.Barrier()
        return 2
    servers = [r for r, x in enumerate(roles) if x & 1]
    models = [r for r, x in enumerate(roles) if not x & 1]
    srv = world.Split(1, world.rank)
    io = world.Dup()
    if world.rank == servers[0]:
        text = _table(servers).encode()
        for m in models:
            io.Send([text, MPI.CHAR], m, 7702)
    problems: list[str] = []
    clients = _receive(io, models, world.rank, servers, mode, problems)
    counts = srv.gather({m: (c.nbytes, c.messages, c.close_a) for m, c in clients.items()})
    aborted = {m: c.aborted for m, c in clients.items() if c.aborted is not None}
    if srv.rank == 0:
        for m in set(models) - set(aborted):  # CLOSE counters = what the servers received
            total = [sum(cnt[m][0] for cnt in counts), sum(cnt[m][1] for cnt in counts)]
            if counts[0][m][2][1:] != total or counts[0][m][2][0] < 0:
                problems.append(f"rank {m}: CLOSE says {counts[0][m][2]}, received {total}")
        report = "".join(f"{k} {v}\n" for k, v in REPORT.items()).encode()
        for m in set(models) - set(aborted):
            io.Send([report, MPI.CHAR], m, 7703)
    problems = sum(srv.gather(problems) or [], [])
    aborts = srv.gather(aborted)
    if srv.rank == 0:
        sent = {m: counts[0][m][2][1] for m in set(models) - set(aborted)}
        Path(out).write_text(json.dumps({"problems": problems, "bytes_sent": sent,
                                         "aborted": aborts}))
    io.Free()
    srv.Free()
    return 0


# ----------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The library in a prefix, and the two test models compiled against it."""
    tmp = tmp_path_factory.mktemp("ioclient")
    r = build_client(tmp / "prefix")
    model_c, model_f = tmp / "model_c", tmp / "model_f"
    subprocess.run([str(r.mpicc), "-Wall", "-Werror", str(DATA / "model_c.c"), "-o",
                    str(model_c), *r.c_flags.split()], check=True, timeout=120)
    subprocess.run([str(r.fc), "-Wall", str(DATA / "model_f.f90"), "-o", str(model_f),
                    *r.fortran_flags.split()], check=True, timeout=120, cwd=tmp)
    return r, model_c, model_f


def _mpmd(exe: Path | tuple[Path, Path], mode: str, tmp: Path, ok: bool = True,
          **env: str) -> tuple[str, dict]:
    """Run 2 model ranks (exe twice, or one rank of each exe) and 2 stub servers."""
    out = tmp / f"stub-{mode}.json"
    models = ["-n", "2", str(exe), mode] if isinstance(exe, Path) else [
        "-n", "1", str(exe[0]), mode, ":", "-n", "1", str(exe[1]), mode]
    cmd = [str(BIN / "mpiexec"), *models, ":", "-n", "2", sys.executable,
           __file__, "--stub", str(out), mode]
    environ = {**os.environ, "PYTHONPATH": str(SRC), **env}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=environ)
    if not ok:
        return proc.stderr, {"returncode": proc.returncode}
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    return proc.stdout, result


def _reports(stdout: str) -> dict[int, list[float]]:
    rows = [line.split()[1:] for line in stdout.splitlines() if line.startswith("REPORT")]
    return {int(r[0]): [float(x) for x in r[1:]] for r in rows}


def _check_reports(stdout: str, stub: dict, ranks=(0, 1)) -> None:
    reports = _reports(stdout)
    assert sorted(reports) == sorted(ranks), stdout
    for rank in ranks:
        sent, busy, hwm, written, files, blocked = reports[rank]
        assert sent == stub["bytes_sent"][str(rank)]
        assert (busy, hwm, written, files) == tuple(
            REPORT[k] for k in ("server_busy_fraction", "server_memory_hwm_bytes",
                                "bytes_written", "files_written"))
        assert blocked >= 0


# ----------------------------------------------------------------------------- tests

def test_c_model_sends_what_the_table_asks(built, tmp_path):
    _, model_c, _ = built
    stdout, stub = _mpmd(model_c, "normal", tmp_path)
    assert stub["problems"] == []
    _check_reports(stdout, stub)


def test_c_model_with_a_tiny_buffer_blocks_and_still_delivers(built, tmp_path):
    # 200 bytes: no field message fits beside another, every send waits for the last
    _, model_c, _ = built
    stdout, stub = _mpmd(model_c, "normal", tmp_path, ENSIO_IOCLIENT_BUFFER_MB="0.0002")
    assert stub["problems"] == []
    _check_reports(stdout, stub)


def test_fortran_model_sends_the_same(built, tmp_path):
    _, _, model_f = built
    stdout, stub = _mpmd(model_f, "normal", tmp_path)
    assert stub["problems"] == []
    _check_reports(stdout, stub)
    for rank in (0, 1):
        unknown = f"ensio_ioclient_send_double: unknown field id 'nosuch' on rank {rank}"
        assert f"ERR unknown: {unknown}" in stdout


def test_c_and_fortran_ranks_in_one_model(built, tmp_path):
    # one MPMD job: rank 0 runs the C model, rank 1 the Fortran one; they share the model comm
    _, model_c, model_f = built
    stdout, stub = _mpmd((model_c, model_f), "normal", tmp_path)
    assert stub["problems"] == []
    _check_reports(stdout, stub)


def test_bad_buffer_size_is_an_init_error(built, tmp_path):
    _, model_c, _ = built
    stderr, res = _mpmd(model_c, "normal", tmp_path, ok=False, ENSIO_IOCLIENT_BUFFER_MB="lots")
    assert res["returncode"] != 0
    assert "init: ENSIO_IOCLIENT_BUFFER_MB: expected a positive number of MiB, got 'lots'" \
        in stderr


def test_c_errors_name_field_and_rank_and_the_run_goes_on(built, tmp_path):
    _, model_c, _ = built
    stdout, stub = _mpmd(model_c, "errors", tmp_path)
    assert stub["problems"] == []  # the failed calls sent nothing
    _check_reports(stdout, stub)
    for rank in (0, 1):
        assert (f"ERR unknown: ensio_ioclient_send_double: unknown field id 'nosuch' on rank "
                f"{rank}") in stdout
        assert (f"ERR size: ensio_ioclient_send_double: field 'tas' on rank {rank}: 23 values, "
                f"expected 24") in stdout
        assert f"ERR active: ensio_ioclient_is_active: unknown field id 'nosuch' on rank {rank}" \
            in stdout
        assert f"ERR closed: ensio_ioclient_set_domain on rank {rank}: the definition is " \
            "already closed" in stdout
        assert f"ERR nostep: ensio_ioclient_is_active: field 'tas' on rank {rank}: no step yet" \
            in stdout


def test_c_server_error_reaches_the_model(built, tmp_path):
    _, model_c, _ = built
    stdout, stub = _mpmd(model_c, "server_error", tmp_path)
    assert stub["problems"] == []
    expect = "ioserver (rank 2): field 'tas' of rank 0 rejected by the stub"
    assert f"FINALIZE rank 0: {expect}" in stdout
    assert "FINALIZE rank 1" not in stdout and "STOPPED rank 1" not in stdout
    assert 1 in _reports(stdout)


def test_c_abort_reaches_every_server(built, tmp_path):
    _, model_c, _ = built
    stdout, stub = _mpmd(model_c, "abort", tmp_path)
    assert stub["problems"] == []
    assert "ABORTED rank 0 rc 0" in stdout
    assert stub["aborted"] == [{"0": "model blew up at step 2"}] * 2
    _check_reports(stdout, stub, ranks=(1,))


def test_missing_compilers_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(BuildError, match="Fortran compiler not found: /no/gfortran"):
        build_client(tmp_path, fc="/no/gfortran")
    rc = cli_main(["ioclient", "build", "--prefix", str(tmp_path), "--mpicc", "/no/mpicc"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert "MPI C compiler not found: /no/mpicc" in err
    assert not (tmp_path / "lib").exists()


def test_cli_build_installs_the_client_its_python_part_and_xios(tmp_path, capsys):
    assert cli_main(["ioclient", "build", "--prefix", str(tmp_path / "p")]) == 0
    names = sorted(p.relative_to(tmp_path / "p").as_posix() for p in (tmp_path / "p").rglob("*")
                   if p.is_file())
    assert names == ["include/ensio_ioclient.h", "include/ensio_ioclient.mod",
                     "include/ensio_ioclient_c.mod", "include/xios.mod",
                     "lib/libensio_ioclient.a", "lib/libensio_ioclient.so",
                     "lib/libensio_ioclient_py.so", "lib/libxios.a", "lib/libxios.so"]
    assert "-lensio_ioclient" in capsys.readouterr().out


if __name__ == "__main__" and sys.argv[1:2] == ["--stub"]:
    sys.exit(_stub(sys.argv[2], sys.argv[3]))

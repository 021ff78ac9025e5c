"""HDF5 files (h5py, HDF5's sec2 driver) through the transfer interposer: Veros-like restarts.

h5py opens a file with ``open`` (a tentative ``O_RDWR`` open of an existing name before
a create), then works on the descriptor: ``fstat`` (file identity), ``pread``/``pwrite``,
``ftruncate``, ``flock`` (HDF5's file locking, on by default) and ``close``. Under the
interposer the descriptor is a memory file, so a restart written by h5py must be the
bytes the same program writes to disk, and ``ensio analyse`` must read and rewrite
such members in place in memory (plain HDF5, chunked and gzip-compressed: the library
path, a copy renamed into place, backed up first by the undo journal). The journal
backs a file up with ``link``; a held file has no inode to link to, so the interposer
answers ``EXDEV`` (as between two file systems) and the journal copies it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from netCDF4 import Dataset
from seeds import draw_seed
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    Host,
    host_fixture,
    interposer_cache_fixture,
    wait_for,
    write_config,
)
from veros_like import grid_axes, write_grid_file

TESTS = Path(__file__).resolve().parent
PY = sys.executable
NX, NY, NZ, NE = 8, 6, 3, 4

# write_veros_like into argv[1] (seed argv[2]; land from argv[3]), as a model would
WRITER = rf"""
import sys
sys.path.insert(0, sys.argv[4])
import numpy as np
from veros_like import write_veros_like
land = np.load(sys.argv[3])
write_veros_like(sys.argv[1], nx={NX}, ny={NY}, nz={NZ}, tau=1, land=land, seed=int(sys.argv[2]))
"""

# sha256 of each file, and every dataset of it as h5py reads it (HDF5 file locking on)
READER = r"""
import hashlib, json, sys
import h5py
out = {}
for p in sys.argv[1:]:
    with open(p, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    values = {}
    with h5py.File(p, "r") as f:
        f.visititems(lambda n, o: values.__setitem__(n, hashlib.sha256(o[()].tobytes())
                                                     .hexdigest()) if hasattr(o, "dtype") else None)
    out[p] = [digest, values]
print(json.dumps(out, sort_keys=True))
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _members(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("mem")) if d.exists() else []


@pytest.fixture
def case(host: Host):
    """Land of a Veros-like grid (drawn), seeds of NE members, a two-way transfer config."""
    rng = np.random.default_rng(draw_seed("transfer hdf5"))
    w = host.work
    np.save(w / "land.npy", rng.random((NX, NY, NZ)) < 0.2)
    seeds = [int(s) for s in rng.integers(1 << 30, size=NE)]
    (w / "tr").mkdir()
    (w / "ref").mkdir()
    (w / "writer.py").write_text(WRITER)
    (w / "reader.py").write_text(READER)
    (w / "t.yaml").write_text(yaml.safe_dump({
        "components": ["model", "analysis"],
        "connections": [
            {"name": "forecasts", "from": "model", "to": "analysis", "files": ["tr/*mem*.nc*"]},
            {"name": "analyses", "from": "analysis", "to": "model", "files": ["tr/*mem*.nc*"]}]}))
    return host, rng, seeds


def _write(host: Host, path: str, seed: int, transfer: bool) -> None:
    cmd = [PY, "writer.py", path, str(seed), "land.npy", str(TESTS)]
    if transfer:
        p = host.run(host.work / "t.yaml", "model", *cmd)
    else:
        p = subprocess.run(cmd, cwd=host.work, env=host.env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _read(host: Host, component: str, *names: str) -> dict:
    p = host.run(host.work / "t.yaml", component, PY, "reader.py", *names)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_h5py_restart_in_memory_is_the_file_byte_for_byte(case):
    """Create, read back, create again over a held file (HDF5's tentative O_RDWR open of
    an existing name, then O_TRUNC), rewrite in place with ``r+``: as on disk."""
    host, _, seeds = case
    w = host.work
    _write(host, "tr/mem001.nc", seeds[0], transfer=True)
    _write(host, "ref/mem001.nc", seeds[0], transfer=False)
    _write(host, "ref/mem002.nc", seeds[1], transfer=False)
    assert _members(w / "tr") == []
    want = _read(host, "analysis", "ref/mem001.nc")["ref/mem001.nc"]
    assert _read(host, "analysis", "tr/mem001.nc")["tr/mem001.nc"] == want
    assert want[0] == _sha(w / "ref" / "mem001.nc")
    # a second create of the same (held) name replaces it, as h5py's "w" replaces a file
    _write(host, "tr/mem001.nc", seeds[1], transfer=True)
    got = _read(host, "analysis", "tr/mem001.nc")["tr/mem001.nc"]
    assert got[0] == _sha(w / "ref" / "mem002.nc")
    # r+ in place (a chunk rewritten, the file locked by HDF5 while open)
    edit = ("import sys, h5py\nwith h5py.File(sys.argv[1], 'r+') as f:\n"
            "    f['core/temp'][2, 3, 1, 1] = 123.25\n")
    for path in ("tr/mem001.nc", "ref/mem002.nc"):
        cmd = [PY, "-c", edit, path]
        p = (host.run(w / "t.yaml", "model", *cmd) if path.startswith("tr") else
             subprocess.run(cmd, cwd=w, env=host.env, capture_output=True, text=True))
        assert p.returncode == 0, p.stderr
    got = _read(host, "analysis", "tr/mem001.nc")["tr/mem001.nc"]
    assert got[0] == _sha(w / "ref" / "mem002.nc")
    assert _members(w / "tr") == []
    held = {s.path: s.state for s in host.status()}
    assert held == {str((w / "tr" / "mem001.nc").resolve()): "complete"}


def _observations(path: Path, land: np.ndarray, rng: np.random.Generator, m: int = 12) -> None:
    """``m`` observations of random interior ocean rows of core/temp at tau (by index)."""
    xt, yt, _ = grid_axes(NX, NY, NZ)
    i, j, _ = np.nonzero(~land)
    rows = rng.choice(i.size, m, replace=False)
    with Dataset(path, "w") as ds:
        ds.createDimension("obs", m)
        for name, v in (("lon", xt[i[rows]]), ("lat", yt[j[rows]]),
                        ("value", rng.normal(10.0, 2.0, m)), ("error", rng.uniform(0.5, 1.5, m))):
            ds.createVariable(name, "f8", ("obs",))[:] = v
        ds.createVariable("index", "i8", ("obs",))[:] = rows


def _config(w: Path, members: str) -> Path:
    cfg = {
        "ensemble": {"members": members, "size": NE, "dims": ["xt", "yt", "zt", "level"],
                     "halo": {"xt": 2, "yt": 2}, "cyclic": ["xt"], "grid": "grid.nc",
                     "time_level": {"dim": "level", "from": "core/tau"},
                     "coordinates": {"lon": "xt", "lat": "yt", "level": "zt"},
                     "variables": [{"name": "core/temp", "mask": "maskT"},
                                   {"name": "core/salt", "mask": "maskT"}]},
        "observations": [{"file": "obs.nc", "variable": "core/temp"}],
        "analysis": {"filter": "letkf", "localization": {"radius_km": 1500}},
    }  # fmt: skip
    path = w / f"{members.split('/')[0]}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_ensio_analyse_rewrites_hdf5_members_in_place_in_memory(case):
    """Journaled in-place analysis (io.journal: true, the default) of chunked, compressed
    plain-HDF5 members held by the daemon: bitwise the file-based analysis, no member file
    on disk. The journal's backup link of a held member is EXDEV, so it copies."""
    host, rng, seeds = case
    w = host.work
    land = np.load(w / "land.npy")
    write_grid_file(w / "grid.nc", nx=NX, ny=NY, nz=NZ, land=land)
    _observations(w / "obs.nc", land, rng)
    names = [f"mem{k:03d}.nc" for k in range(1, NE + 1)]
    for name, seed in zip(names, seeds, strict=True):
        _write(host, f"tr/{name}", seed, transfer=True)
        _write(host, f"ref/{name}", seed, transfer=False)
    prior = {n: _sha(w / "ref" / n) for n in names}
    ref = subprocess.run([PY, "-m", "ensio", "analyse", str(_config(w, "ref/mem{member:03d}.nc"))],
                         cwd=w, env=host.env, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    assert all(_sha(w / "ref" / n) != prior[n] for n in names)  # the analysis changed them
    p = host.run(w / "t.yaml", "analysis", PY, "-m", "ensio", "analyse",
                 str(_config(w, "tr/mem{member:03d}.nc")), timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[:3] == ref.stdout.splitlines()[:3]
    assert _members(w / "tr") == []  # never on disk
    assert not (w / "tr" / ".ensio-journal").exists()  # committed and cleaned up
    got = _read(host, "model", *(f"tr/{n}" for n in names))
    want = _read(host, "model", *(f"ref/{n}" for n in names))
    for n in names:
        assert got[f"tr/{n}"] == want[f"ref/{n}"], n
        assert got[f"tr/{n}"][0] == _sha(w / "ref" / n), n
    held = {s.path: (s.state, s.component) for s in host.status()}
    assert held == {str((w / "tr" / n).resolve()): ("complete", "analysis") for n in names}


LINKS = r"""
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(fn, *args):
    if fn(*[os.fsencode(a) for a in args]) == 0:
        return 0
    return errno.errorcode[ctypes.get_errno()]
def py_link(a, b):
    try:
        os.link(a, b)
        return 0
    except OSError as exc:
        return errno.errorcode[exc.errno]
res = {}
if sys.argv[1] == "model":
    with open("fc/mem001.nc", "wb") as f:
        f.write(b"held")
        res["while_written"] = py_link("fc/mem001.nc", "other/while.nc")
res["link_held"] = call(libc.link, "fc/mem001.nc", "other/backup.nc")
res["linkat_held"] = py_link("fc/mem001.nc", "other/backup.nc")
res["onto_held"] = call(libc.link, "other/real.dat", "fc/mem001.nc")
free = "fc/mem002.nc" if sys.argv[1] == "model" else "fc/mem003.nc"
res["real_to_free_name"] = py_link("other/real.dat", free)
res["real_to_real"] = call(libc.link, "other/real.dat", f"other/{sys.argv[1]}.dat")
print(json.dumps(res, sort_keys=True))
"""


def test_link_of_a_held_file_is_a_cross_device_link(host: Host):
    """link/linkat of a held file: EXDEV (writer and reader alike); onto a held name:
    EEXIST; names the daemon does not hold are real files, linked by the kernel."""
    w = host.work
    (w / "fc").mkdir()
    (w / "other").mkdir()
    (w / "other" / "real.dat").write_text("on disk")
    config = write_config(w / "t.yaml", [str(w / "fc" / "mem*.nc")])
    for component, first in (("model", {"while_written": "EXDEV"}), ("post", {})):
        p = host.run(config, component, PY, "-c", LINKS, component)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout) == {**first, "link_held": "EXDEV", "linkat_held": "EXDEV",
                                        "onto_held": "EEXIST", "real_to_free_name": 0,
                                        "real_to_real": 0}, component
    assert sorted(x.name for x in (w / "other").iterdir()) == ["model.dat", "post.dat",
                                                               "real.dat"]
    assert sorted(x.name for x in (w / "fc").iterdir()) == ["mem002.nc", "mem003.nc"]
    assert os.stat(w / "other" / "real.dat").st_nlink == 5
    assert (w / "fc" / "mem002.nc").read_text() == "on disk"
    c = host.run(config, "post", "cat", str(w / "fc" / "mem001.nc"))
    assert c.returncode == 0 and c.stdout == "held", c.stderr


REMOVE = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def remove(p):
    return 0 if libc.remove(os.fsencode(p)) == 0 else errno.errorcode[ctypes.get_errno()]
with open("fc/mem001.nc", "wb") as f:
    f.write(b"held")
with open("fc/mem002.nc", "wb") as f:
    f.write(b"held too")
res = {"held": remove("fc/mem001.nc"), "exists": os.path.exists("fc/mem001.nc"),
       "again": remove("fc/mem001.nc"), "on_disk": remove("fc/mem003.nc"),
       "dir": remove("fc/sub")}
print(json.dumps(res, sort_keys=True))
"""


def test_remove_of_a_held_file_forgets_it_as_unlink_does(host: Host):
    """C's remove() (HDF5's H5Fdelete, programs deleting a file) unlinks inside glibc, past
    the interposer: it is interposed as unlink. Names not held are real files (and
    directories: remove is rmdir there)."""
    w = host.work
    (w / "fc" / "sub").mkdir(parents=True)
    (w / "fc" / "mem003.nc").write_text("a real file")
    config = write_config(w / "t.yaml", [str(w / "fc" / "mem*.nc")])
    p = host.run(config, "model", PY, "-c", REMOVE)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"held": 0, "exists": False, "again": "ENOENT",
                                    "on_disk": 0, "dir": 0}
    assert list((w / "fc").iterdir()) == []
    assert {s.path for s in host.status()} == {str(w / "fc" / "mem002.nc")}
    c = host.run(config, "post", "cat", str(w / "fc" / "mem001.nc"))
    assert c.returncode != 0 and "No such file" in c.stderr


KILLED = r"""
import os, signal, sys
import h5py
import numpy as np
f = h5py.File(sys.argv[1], "w")
f["core/temp"] = np.arange(1000.0)
f.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_restart_rewritten_after_its_writer_was_killed(case):
    """A member killed while h5py writes its restart leaves a failed file (readers: EIO);
    the retry's h5py create succeeds (HDF5's first, tentative open of the existing name
    gets EIO, then it creates) and readers see the new restart."""
    host, _, seeds = case
    w = host.work
    p = host.run(w / "t.yaml", "model", PY, "-c", KILLED, "tr/mem001.nc")
    assert p.returncode != 0
    # the daemon learns of the death from the writer's connection ending, which it reads
    # on its own thread: the file is "writing" until then, and must become "failed"
    held = str((w / "tr" / "mem001.nc").resolve())
    wait_for(lambda: {s.path: s.state for s in host.status()}.get(held) != "writing",
             what="the daemon to notice the killed writer")
    assert {s.path: s.state for s in host.status()} == {held: "failed"}
    c = host.run(w / "t.yaml", "analysis", "cat", "tr/mem001.nc")
    assert c.returncode != 0 and "Input/output error" in c.stderr, c.stderr
    _write(host, "tr/mem001.nc", seeds[0], transfer=True)
    _write(host, "ref/mem001.nc", seeds[0], transfer=False)
    got = _read(host, "analysis", "tr/mem001.nc")["tr/mem001.nc"]
    assert got[0] == _sha(w / "ref" / "mem001.nc")
    assert _members(w / "tr") == []

"""A small real `ensio analyse` setup for the lock / exactly-once / all-or-nothing tests.

Members are written by tests/cases.py with the plain netCDF4 library: a raw
float64 variable, a big-endian float32 one and a chunked, compressed one
(library path: whole-file backup and replace). Observations observe state
rows directly (``index``), so the analysis is a deterministic global ETKF.
Expected files always come from a *reference run* on a fresh copy, checked
against the prior (it changed) — never from the run under test.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np
import yaml
from cases import EnsembleCase, VarCase, write_observations

ENSIO = [sys.executable, "-m", "ensio"]
CHILD = Path(__file__).with_name("safety_child.py")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
VARS = [
    VarCase("state", ("lat", "lon")),
    VarCase("t", ("lev", "lat", "lon"), "f4", "big"),
    VarCase("q", ("lat", "lon"), "f4", chunked=True),
]
MARKERS = ("ensio-tmp", "ensio-staged", "ensio-partial", "ensio-restore", ".ensio-journal",
           ".ensio-lock")


@dataclass
class Setup:
    root: Path  # members, observations, config
    out: Path  # products
    members: list[Path]
    config: Path

    @property
    def products(self) -> list[Path]:
        return [self.out / "mean.nc", self.out / "spread.nc"]


def make_setup(root: Path, *, members: int = 4, nlat: int = 6, nlon: int = 10,
               out: Path | None = None, seed: int = 5) -> Setup:
    """Members, one observation file and ``ensio.yaml`` in ``root``; products in ``out``."""
    case = EnsembleCase(members=members, nlat=nlat, nlon=nlon, nlev=2, variables=VARS, seed=seed)
    paths = case.write(root)
    rng = np.random.default_rng(seed + 1)
    n_x = nlat * nlon * 4
    rows = rng.choice(n_x, 12, replace=False)
    write_observations(root / "obs.nc", np.zeros(12), np.zeros(12),
                       rng.standard_normal(12), np.full(12, 0.5), rows)
    out = root / "out" if out is None else out
    raw = case.config(root)
    raw["observations"] = [{"file": "obs.nc"}]
    raw["analysis"] = {"filter": "etkf", "inflation": {"forget": 0.9}}
    raw["output"] = {"mean": str(out / "mean.nc"), "spread": str(out / "spread.nc")}
    cfg = root / "ensio.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return Setup(root, out, paths, cfg)


def copy_setup(src: Setup, root: Path) -> Setup:
    """The same prior files in ``root`` (products in ``root/out``)."""
    shutil.copytree(src.root, root, ignore=shutil.ignore_patterns("out"))
    raw = yaml.safe_load((root / "ensio.yaml").read_text())
    raw["ensemble"]["members"] = str(root / "mem{member:03d}.nc")
    raw["output"] = {"mean": str(root / "out" / "mean.nc"),
                     "spread": str(root / "out" / "spread.nc")}
    (root / "ensio.yaml").write_text(yaml.safe_dump(raw))
    return Setup(root, root / "out", [root / p.name for p in src.members], root / "ensio.yaml")


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ENSIO_FAULT", "ENSIO_TEST"))}
    e.update(extra)
    return e


def analyse(s: Setup, *args: str, ranks: int = 1, extra_env: dict | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [*ENSIO, "analyse", str(s.config), *args]
    if ranks > 1:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env(**(extra_env or {})))


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def member_digests(s: Setup) -> list[str]:
    return [sha(p) for p in s.members]


def fields(path: Path) -> dict[str, np.ndarray]:
    """The state variables of a product file (for comparisons independent of history)."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return {v.name: np.asarray(ds[v.name][:]) for v in VARS}


def same_fields(a: Path, b: Path) -> bool:
    fa, fb = fields(a), fields(b)
    return all(np.array_equal(fa[k], fb[k]) for k in fa)


def leftovers(*dirs: Path) -> list[str]:
    """Temporary, staged, journal and lock files anywhere under ``dirs``."""
    found = []
    for d in dirs:
        for base, subdirs, files in os.walk(d):
            found += [os.path.join(base, n) for n in [*files, *subdirs]
                      if any(m in n for m in MARKERS)]
    return found


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit status 2 and exactly one stderr line containing every needle."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def prior_and_reference(root: Path) -> tuple[Setup, Setup]:
    """A prior ensemble and a copy analysed once by ``ensio analyse`` (the reference)."""
    prior = make_setup(root / "prior")
    ref = copy_setup(prior, root / "ref")
    assert analyse(ref).returncode == 0
    assert member_digests(ref) != member_digests(prior)
    return prior, ref

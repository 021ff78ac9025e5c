"""Shared by tests/test_ioclient_*.py: build the C/Fortran client, compile a test model
against it, run it in each mode (MPMD with ``ensio ioserver`` for server mode), and
compare netCDF files variable by variable, bitwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import yaml

from ensio.ioserver.build import BuildResult, build_client

DATA = Path(__file__).parent / "data" / "ioclient"
BIN = Path(sys.executable).parent
ENSIO = str(BIN / "ensio")
MPIEXEC = str(BIN / "mpiexec")
#: A safety net that fails a hung test; never the mechanism of a test.
TIMEOUT = 240


def build(prefix: Path, **compilers: str) -> BuildResult:
    """``ensio ioclient build`` into ``prefix`` (compilers: mpicc=, mpifort=)."""
    return build_client(prefix, **compilers)


def compile_model(r: BuildResult, source: str, exe: Path, *defines: str) -> Path:
    """Compile tests/data/ioclient/<source> (a .F90: preprocessed) against the client."""
    subprocess.run([str(r.fc), "-Wall", *(f"-D{d}" for d in defines), str(DATA / source),
                    "-o", str(exe), *r.fortran_flags.split()], check=True, timeout=TIMEOUT,
                   cwd=exe.parent, capture_output=True)
    return exe


def write_config(path: Path, mode: str, body: dict | None = None) -> Path:
    """An iodef YAML with ``mode`` (one server in server mode), ``body`` merged in."""
    raw = {"mode": mode, "servers": 1, "output_dir": str(path.parent / f"out-{path.stem}")}
    raw.update(body or {})
    path.write_text(yaml.safe_dump({"ioserver": raw}))
    return path


def run_job(models: list[str], nmodel: int, config: Path, mode: str, *,
            mpiexec: tuple[str, ...] = (MPIEXEC,), server_env: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``mpiexec -n nmodel MODEL...`` (``: -n 1 ensio ioserver CONFIG`` in server mode)."""
    argv = [*mpiexec, "-n", str(nmodel), *models]
    if mode == "server":
        argv += [":", *server_env, "-n", "1", ENSIO, "ioserver", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def raw_variables(path: Path) -> dict[str, tuple[np.ndarray, dict]]:
    """Every variable of a netCDF file: values as stored (no masking) and attributes."""
    out = {}
    with netCDF4.Dataset(path) as ds:
        for name, v in ds.variables.items():
            v.set_auto_maskandscale(False)
            out[name] = (np.asarray(v[...]), {k: v.getncattr(k) for k in v.ncattrs()})
    return out


def assert_bitwise(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Same dtype, shape and bytes (NaN and -0.0 included)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}")
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), what


def assert_same_files(got: Path, want: Path, skip_global: tuple[str, ...] = ("history",)
                      ) -> None:
    """Two files hold the same variables, values (bitwise), attributes and global
    attributes (but ``skip_global``: the history names the time and mode)."""
    g, w = raw_variables(got), raw_variables(want)
    assert list(g) == list(w), (got, list(g), list(w))
    for name, (values, attrs) in w.items():
        assert_bitwise(g[name][0], values, f"{got.name}:{name}")
        assert g[name][1].keys() == attrs.keys(), name
        for k, a in attrs.items():
            np.testing.assert_array_equal(g[name][1][k], a, err_msg=f"{name}:{k}")
    with netCDF4.Dataset(got) as a, netCDF4.Dataset(want) as b:
        ga = {k: a.getncattr(k) for k in a.ncattrs() if k not in skip_global}
        gb = {k: b.getncattr(k) for k in b.ncattrs() if k not in skip_global}
        assert ga == gb, (got, ga, gb)

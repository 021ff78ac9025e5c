"""The ``ensio`` command: one-line errors, exit status 2, nothing modified."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import needs
import numpy as np
import xarray as xr
import yaml
from cases import EnsembleCase, VarCase, reference_matrix, sha256, variable_bytes
from mpi4py import MPI

from ensio.config import config_from_dict
from ensio.io.modes.ensemble import read_ensemble, write_ensemble

ENSIO = [sys.executable, "-m", "ensio"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ENSIO, *map(str, args)], capture_output=True, text=True, timeout=120)


def _case(tmp_path: Path) -> tuple[EnsembleCase, Path, list[Path]]:
    case = EnsembleCase(members=3, variables=[VarCase("state", ("lat", "lon"))])
    paths = case.write(tmp_path)
    cfg = tmp_path / "ensio.yaml"
    cfg.write_text(yaml.safe_dump(case.config(tmp_path)))
    return case, cfg, paths


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """README: errors in config or input files are one line, exit status 2."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_config_key(tmp_path):
    _, cfg, paths = _case(tmp_path)
    raw = yaml.safe_load(cfg.read_text())
    raw["io"]["jurnal"] = True
    cfg.write_text(yaml.safe_dump(raw))
    before = [sha256(p) for p in paths]
    _one_line_error(_run("bench", "io", cfg, "--repeat", "1"), "io.jurnal", "unknown config key")
    assert [sha256(p) for p in paths] == before


def test_missing_member_via_cli(tmp_path):
    _, cfg, paths = _case(tmp_path)
    paths[1].unlink()
    before = [sha256(p) for p in (paths[0], paths[2])]
    _one_line_error(_run("bench", "io", cfg, "--repeat", "1"), str(paths[1]), "not found")
    assert [sha256(p) for p in (paths[0], paths[2])] == before


def test_too_many_io_tasks_via_cli(tmp_path):
    _, cfg, paths = _case(tmp_path)
    before = [sha256(p) for p in paths]
    _one_line_error(_run("bench", "io", cfg, "--repeat", "1", "--set", "io.tasks=3"), "io.tasks")
    assert [sha256(p) for p in paths] == before


def test_analysis_files_readable_by_ncdump_and_xarray(tmp_path):
    case = EnsembleCase(
        members=3,
        variables=[VarCase("state", ("lat", "lon")), VarCase("t", ("lev", "lat", "lon"), "f4")],
    )
    paths = case.write(tmp_path)
    aux = [variable_bytes(p, "aux") for p in paths]
    cfg = config_from_dict(case.config(tmp_path))
    block = read_ensemble(cfg, MPI.COMM_SELF)
    seed = 90210
    block.data[...] = np.random.default_rng(seed).standard_normal(block.data.shape)
    write_ensemble(cfg, MPI.COMM_SELF, block)
    np.testing.assert_allclose(
        reference_matrix(paths, case.variables), block.data, rtol=1e-6, err_msg=f"seed {seed}"
    )
    ncdump = shutil.which("ncdump")
    for m, p in enumerate(paths):
        with xr.open_dataset(p) as ds:
            got = np.concatenate([ds["state"].values.ravel(), ds["t"].values.ravel()])
            np.testing.assert_allclose(got, block.data[m], rtol=1e-6, err_msg=f"seed {seed}")
        assert variable_bytes(p, "aux") == aux[m]
        if ncdump:
            out = subprocess.run([ncdump, str(p)], capture_output=True, text=True, check=True)
            assert "state =" in out.stdout
    needs.tool("ncdump")  # xarray checked above; ncdump not (Debian netcdf-bin)

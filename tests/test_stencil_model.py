"""The stencil model of ``ensio bench ioserver`` (models/stencil.py), on one process.

A sweep is checked against the formula of the module docstring written here
afresh with padded arrays (wrap in longitude, edge rows at the poles and at the
top and bottom levels), not with the model's in-place slices. The decomposition
over ranks is tests/mpi/test_stencil_mpi.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

from ensio.cli.main import build_parser
from ensio.errors import ConfigError
from ensio.models.stencil import KAPPA, StencilModel, StencilSettings


def reference_sweep(T: np.ndarray, n: int) -> np.ndarray:
    """``T + κ (∇²_h T + ½ ∇²_z T) + 10⁻³ sin(0.01 n)`` on the global ``(nz, ny, nx)`` field."""
    lon = np.pad(T, ((0, 0), (0, 0), (1, 1)), mode="wrap")  # periodic
    lat = np.pad(T, ((0, 0), (1, 1), (0, 0)), mode="edge")  # mirrored row beyond each pole
    lev = np.pad(T, ((1, 1), (0, 0), (0, 0)), mode="edge")  # closed top and bottom
    horizontal = lon[:, :, :-2] + lon[:, :, 2:] + lat[:, :-2, :] + lat[:, 2:, :] - 4.0 * T
    vertical = lev[:-2] + lev[2:] - 2.0 * T
    return T + KAPPA * (horizontal + 0.5 * vertical) + 1e-3 * np.sin(0.01 * n)


def model_with(T: np.ndarray) -> StencilModel:
    nz, ny, nx = T.shape
    model = StencilModel.build(nx, ny, nz, MPI.COMM_SELF)
    model.t[:, 1:-1] = T
    return model


@pytest.mark.parametrize("shape", [(3, 5, 7), (1, 4, 6), (2, 1, 3)])
def test_one_sweep_is_the_formula(rng, shape):
    T = 280.0 + 10.0 * rng.standard_normal(shape)
    n = int(rng.integers(1, 1000))
    model = model_with(T)
    model.step(MPI.COMM_SELF, n, sweeps=1)
    np.testing.assert_allclose(model.t[:, 1:-1], reference_sweep(T, n), rtol=1e-14, atol=0)


def test_sweeps_repeat_the_formula_with_the_same_step(rng):
    T = 280.0 + 10.0 * rng.standard_normal((4, 6, 8))
    model = model_with(T)
    model.step(MPI.COMM_SELF, 5, sweeps=3)
    model.step(MPI.COMM_SELF, 6, sweeps=1)
    expected = reference_sweep(reference_sweep(reference_sweep(T, 5), 5), 5)
    np.testing.assert_allclose(model.t[:, 1:-1], reference_sweep(expected, 6), rtol=1e-13,
                               atol=0)


def test_closed_boundaries_conserve_heat(rng):
    """Periodic and mirrored boundaries: diffusion only moves heat, the forcing adds it."""
    T = 280.0 + 10.0 * rng.standard_normal((3, 6, 8))
    model = model_with(T)
    model.step(MPI.COMM_SELF, 40, sweeps=4)
    added = 4 * 1e-3 * np.sin(0.4) * T.size
    assert model.t[:, 1:-1].sum() == pytest.approx(T.sum() + added, rel=1e-13)
    assert not np.allclose(model.t[:, 1:-1], T + added / T.size)  # it did diffuse


def test_initial_state_and_output_fields():
    nz, ny, nx = 3, 6, 8
    model = StencilModel.build(nx, ny, nz, MPI.COMM_SELF)
    lat = np.deg2rad(np.linspace(-90 + 15, 90 - 15, ny))  # cell centres, 30° apart
    lon = np.deg2rad(np.linspace(22.5, 360 - 22.5, nx))
    expected = (280.0 + 20.0 * np.outer(np.cos(lat), np.cos(lon))[None]
                - 5.0 * np.arange(nz)[:, None, None])
    np.testing.assert_allclose(model.t[:, 1:-1], expected, rtol=1e-14)
    assert (model.j0, model.nj) == (0, ny)
    scaled = model.field(3).copy()
    np.testing.assert_allclose(scaled, 1.03 * expected, rtol=1e-14)
    np.testing.assert_array_equal(model.field(0), model.t[:, 1:-1])
    np.testing.assert_array_equal(model.surface(), model.t[0, 1:-1])


def test_every_rank_needs_a_row():
    with pytest.raises(ConfigError, match=r"^ny: 3 latitude rows for 4 model ranks"):
        StencilModel.build(8, 3, 2, SimpleNamespace(size=4, rank=0))


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"mode": "server"}, "iodef"),
    ({"mode": "sync"}, "iodef"),
    ({"mode": "bogus", "iodef": "x.yaml"}, "mode"),
    ({"mode": "none", "nx": 0}, "nx"),
    ({"mode": "none", "steps": 0}, "steps"),
    ({"mode": "none", "sweeps": -1}, "sweeps"),
])
def test_settings_errors_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        StencilSettings(**kwargs)


# ------------------------------------------------------------------ ensio model stencil


def ensio(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ensio", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_cli_defaults_are_the_settings_defaults():
    args = build_parser(("model",)).parse_args(["model", "stencil", "--iodef", "io.yaml"])
    d = StencilSettings(iodef="io.yaml")
    for f in fields(StencilSettings):
        if f.name != "iodef":
            assert getattr(args, f.name) == getattr(d, f.name), f.name


def test_cli_runs_without_output_and_writes_the_result(tmp_path):
    out = tmp_path / "res.json"
    res = ensio("model", "stencil", "--mode", "none", "--nx", "8", "--ny", "4", "--nz", "2",
                "--steps", "3", "--sweeps", "2", "--fields", "1", "--json", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(out.read_text())
    assert (data["mode"], data["model_ranks"], data["steps"], data["report"]) == (
        "none", 1, 3, None)
    assert data["seconds"] >= 0 and data["seconds_in_output_calls"] == 0.0


def test_cli_output_mode_without_iodef_is_a_one_line_error(tmp_path):
    out = tmp_path / "res.json"
    res = ensio("model", "stencil", "--mode", "sync", "--json", str(out))
    assert res.returncode == 2
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "iodef" in err, err
    assert not out.exists()

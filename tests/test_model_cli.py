"""``ensio model ...``: the example models as commands (cli/model.py).

The models' own behaviour is tested through the cycles (test_cycle.py); here:
the options reach the right parameters, the printed tables hold the numbers
computed here independently, and a member task starts without MPI or the
analysis (it runs once per member and cycle).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from ensio.cli.main import COMMANDS, commands_for
from ensio.models.l96case import read_state, write_state

SEED = 20240917


def ensio(*args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", "ensio", *args],
                          capture_output=True, text=True, timeout=120)


def imported(stderr: str) -> set[str]:
    """Module names of a ``-X importtime`` report."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def test_only_the_named_subcommand_is_built():
    assert commands_for(["model", "synthrun", "--init", "x"]) == ("model",)
    assert commands_for(["--help"]) == COMMANDS
    assert commands_for(["nosuchcommand"]) == COMMANDS
    assert "model" in COMMANDS


def test_synthrun_shifts_the_field_without_mpi(tmp_path):
    rng = np.random.default_rng(SEED)
    field = rng.standard_normal((3, 5))
    aux = rng.standard_normal((3, 5))
    init, out = tmp_path / "in.nc", tmp_path / "fc" / "out.nc"
    with netCDF4.Dataset(init, "w") as ds:
        ds.createDimension("lat", 3)
        ds.createDimension("lon", 5)
        ds.createVariable("state", "f8", ("lat", "lon"))[:] = field
        ds.createVariable("aux", "f8", ("lat", "lon"))[:] = aux
    res = ensio("model", "synthrun", "--init", str(init), "--out", str(out), "--shift", "2",
                importtime=True)
    assert res.returncode == 0, res.stderr[-2000:]
    modules = imported(res.stderr)
    assert "ensio.models.synthrun" in modules
    assert not {m for m in modules if m.split(".")[0] in ("mpi4py", "scipy")}, seed_note()
    with netCDF4.Dataset(out) as ds:
        got, got_aux = ds["state"][:], ds["aux"][:]
    expected = np.concatenate([field[:, -2:], field[:, :-2]], axis=1)  # eastward by 2
    assert np.array_equal(got, expected), seed_note()
    assert np.array_equal(got_aux, aux)


def test_l96_run_passes_steps(tmp_path):
    rng = np.random.default_rng(SEED)
    x = 8.0 + rng.standard_normal(40)
    write_state(tmp_path / "in.nc", x, 1.5)
    one = ensio("model", "l96", "run", "--init", str(tmp_path / "in.nc"),
                "--out", str(tmp_path / "one.nc"))
    three = ensio("model", "l96", "run", "--init", str(tmp_path / "in.nc"),
                  "--out", str(tmp_path / "three.nc"), "--steps", "3")
    assert one.returncode == 0 and three.returncode == 0, one.stderr + three.stderr
    x1, t1 = read_state(tmp_path / "one.nc")
    x3, t3 = read_state(tmp_path / "three.nc")
    assert t1 == pytest.approx(1.55) and t3 == pytest.approx(1.65)  # dt = 0.05 per step
    assert not np.array_equal(x1, x3)
    # two more steps from the one-step forecast give the three-step forecast
    two = ensio("model", "l96", "run", "--init", str(tmp_path / "one.nc"),
                "--out", str(tmp_path / "again.nc"), "--steps", "2")
    assert two.returncode == 0, two.stderr
    assert np.array_equal(read_state(tmp_path / "again.nc")[0], x3)


def _fake_run(root: Path, forecast: list[np.ndarray], analysis: list[np.ndarray]) -> None:
    for m, (f, a) in enumerate(zip(forecast, analysis, strict=True), start=1):
        write_state(root / "cycle_001" / "forecast" / f"mem{m:03d}.nc", f, 0.0)
        write_state(root / "cycle_001" / "analysis" / f"mem{m:03d}.nc", a, 0.0)


def test_l96_rmse_and_compare_print_the_numbers(tmp_path):
    rng = np.random.default_rng(SEED)
    truth = rng.standard_normal(40)
    fc = [truth + rng.standard_normal(40) for _ in range(3)]
    an = [truth + 0.1 * rng.standard_normal(40) for _ in range(3)]
    write_state(tmp_path / "a" / "truth" / "truth_001.nc", truth, 0.0)
    _fake_run(tmp_path / "a", fc, an)
    res = ensio("model", "l96", "rmse", "--workdir", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr
    cycle, prior, post = res.stdout.splitlines()[1].split()
    prior_ref = np.sqrt(np.mean((sum(fc) / 3 - truth) ** 2))
    post_ref = np.sqrt(np.mean((sum(an) / 3 - truth) ** 2))
    assert cycle == "1" and float(prior) == pytest.approx(prior_ref, abs=1e-4), seed_note()
    assert float(post) == pytest.approx(post_ref, abs=1e-4), seed_note()

    other = [a * (1 + 1e-3) for a in an]
    _fake_run(tmp_path / "b", fc, other)
    res = ensio("model", "l96", "compare", "--workdir", str(tmp_path / "a"),
                "--other", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr
    cycle, rel = res.stdout.splitlines()[1].split()
    diff = max(np.abs(a - b).max() for a, b in zip(an, other, strict=True))
    ref = diff / max(np.abs(b).max() for b in other)
    assert cycle == "1" and float(rel) == pytest.approx(ref, rel=1e-2), seed_note()


def test_missing_subcommand_is_a_usage_error():
    res = ensio("model")
    assert res.returncode == 2
    assert "MODEL" in res.stderr


def seed_note() -> str:
    return f"seed {SEED}"

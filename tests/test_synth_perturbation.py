"""``ensio synth --perturbation A``: smooth full-rank member perturbations.

Checked against independent computations: the smooth field against a direct
double sum over the kernel (no FFT), its variance and correlation against
the closed form of Gaussian-smoothed white noise, the local rank of the
anomalies by SVD; and ``A = 0`` against the paper's members.
"""

from __future__ import annotations

import math
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from ensio.cli.synth import main as synth_main
from ensio.models.smoothnoise import TRUNCATE, smooth_field
from ensio.models.synthetic import SyntheticSpec, field, member_shifts, write_synthetic


def _read(path: Path, name: str = "state") -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return np.asarray(ds[name][:])


def _direct_field(noise: np.ndarray, ny: int, nx: int, scale: float) -> np.ndarray:
    """The definition as a double sum: Σ_a Σ_b g_a g_b noise[j+a, (i+b) mod nx] / norm.

    ``noise`` has ``ny + 2h`` rows (h rows beyond each pole row); longitude
    offsets wrap around (periodic), latitude offsets never do.
    """
    h = math.ceil(TRUNCATE * scale)
    off = np.arange(-h, h + 1)
    g = np.exp(-0.5 * (off / scale) ** 2)
    g /= g.sum()
    out = np.zeros((ny, nx))
    g_lon_sq = np.zeros(nx)
    for b, wb in zip(off, g, strict=True):
        g_lon_sq[b % nx] += wb
        cols = (np.arange(nx) + b) % nx
        for a, wa in zip(off, g, strict=True):
            out += wa * wb * noise[h + a : h + a + ny][:, cols]
    return out / math.sqrt(float(g @ g) * float(g_lon_sq @ g_lon_sq))


@pytest.mark.parametrize(("ny", "nx", "scale"), [(12, 20, 1.5), (9, 6, 2.0)])
def test_smooth_field_equals_the_direct_sum(ny: int, nx: int, scale: float) -> None:
    # (9, 6, 2.0): the kernel (17 points) is wider than the circle of 6 points
    seed = 3
    got = smooth_field(np.random.default_rng(seed), ny, nx, scale, count=2)
    h = math.ceil(TRUNCATE * scale)
    noise = np.random.default_rng(seed).standard_normal((2, ny + 2 * h, nx))
    for c in range(2):
        want = _direct_field(noise[c], ny, nx, scale)
        np.testing.assert_allclose(got[c], want, rtol=0, atol=1e-12)


def test_smooth_field_statistics_periodic_in_lon_not_in_lat(rng: np.random.Generator) -> None:
    """Unit variance; correlation exp(-L²/(4S²)) at lag L, across the dateline too."""
    ny, nx, scale, count = 40, 48, 2.0, 400
    f = smooth_field(rng, ny, nx, scale, count)
    var = f.var(axis=0)  # per point over the independent fields
    assert abs(var.mean() - 1.0) < 0.05  # 400·1920 samples, correlated over ~S² points
    assert abs(var[0].mean() - 1.0) < 0.1 and abs(var[-1].mean() - 1.0) < 0.1  # pole rows too

    def corr(a: np.ndarray, b: np.ndarray) -> float:
        return float((a * b).mean() / np.sqrt((a * a).mean() * (b * b).mean()))

    # continuous Gaussian-smoothed white noise: ρ(L) = exp(-L²/(4S²)); the grid is fine enough
    rho1 = math.exp(-1 / (4 * scale**2))
    assert abs(corr(f[:, :, 10], f[:, :, 11]) - rho1) < 0.03
    assert abs(corr(f[:, :, nx - 1], f[:, :, 0]) - rho1) < 0.03  # across the dateline
    assert abs(corr(f[:, 10, :], f[:, 11, :]) - rho1) < 0.03
    # pole to pole: independent. The estimate's standard error is 1/√n_eff with n_eff =
    # 400 fields × 48 longitudes / Σ_L ρ(L)² (= S√(2π) = 5.0) ≈ 3840, i.e. 0.016: the
    # bound is 5 of them (a field periodic in lat would give ρ(1) = 0.88 here)
    assert abs(corr(f[:, 0, :], f[:, ny - 1, :])) < 0.08


def _case(tmp: Path, name: str, *extra: str, levels: int | None = None) -> Path:
    out = tmp / name
    args = [str(out), "--nx", "36", "--ny", "18", "--members", "6", "--seed", "9", *extra]
    if levels is not None:
        args += ["--levels", str(levels)]
    assert synth_main(args) == 0
    return out


def test_zero_amplitude_is_the_paper_problem_bit_for_bit(tmp_path: Path) -> None:
    default = _case(tmp_path, "default", levels=2)
    zero = _case(tmp_path, "zero", "--perturbation", "0", "--perturbation-scale", "7",
                 levels=2)
    for path in sorted(default.iterdir()):
        assert path.read_bytes() == (zero / path.name).read_bytes(), path.name
    shifts = member_shifts(9, 6)
    for k in range(1, 7):
        state = _read(default / f"mem{k:03d}.nc")
        assert np.array_equal(state, field(36, 18, float(shifts[k - 1]), 2))
        with netCDF4.Dataset(default / f"mem{k:03d}.nc") as ds:
            assert "perturbation" not in ds.ncattrs()


def test_perturbation_changes_only_state(tmp_path: Path) -> None:
    base = _case(tmp_path, "base")
    pert = _case(tmp_path, "pert", "--perturbation", "0.2", "--perturbation-scale", "2")
    for name in ("truth.nc", "obs.nc"):
        assert (base / name).read_bytes() == (pert / name).read_bytes(), name
    diffs = []
    for k in range(1, 7):
        name = f"mem{k:03d}.nc"
        assert np.array_equal(_read(base / name, "aux"), _read(pert / name, "aux"))
        diffs.append(_read(pert / name) - _read(base / name))
        with netCDF4.Dataset(pert / name) as ds:
            assert ds.perturbation == 0.2 and ds.perturbation_scale == 2.0
    d = np.array(diffs)
    assert 0.12 < d.std() < 0.28  # A = 0.2 (6 fields of 648 correlated points)
    assert not np.array_equal(d[0], d[1])  # each member has its own field
    assert "smooth perturbation A = 0.2" in (pert / "ensio.yaml").read_text()


def test_perturbed_anomalies_are_locally_full_rank(tmp_path: Path) -> None:
    """In a 10 × 10 window the paper's anomalies have rank 2, perturbed ones k − 1."""
    k = 6
    base = _case(tmp_path, "base")
    pert = _case(tmp_path, "pert", "--perturbation", "0.05", "--perturbation-scale", "2")

    def window_rank(case: Path) -> int:
        X = np.array([_read(case / f"mem{m:03d}.nc")[4:14, 10:20].ravel()
                      for m in range(1, k + 1)])
        s = np.linalg.svd(X - X.mean(axis=0), compute_uv=False)
        return int((s > 1e-10 * s[0]).sum())

    assert window_rank(base) == 2
    assert window_rank(pert) == k - 1


def test_levels_get_independent_fields(tmp_path: Path) -> None:
    spec = SyntheticSpec(nx=24, ny=12, members=2, seed=1, levels=3, perturbation=1.0,
                         perturbation_scale=1.5)
    case = write_synthetic(tmp_path, spec)
    shift = float(member_shifts(1, 2)[0])
    d = _read(case.members[0]) - field(24, 12, shift, 3)
    assert d.shape == (3, 12, 24)
    assert not np.allclose(d[0], d[1]) and not np.allclose(d[1], d[2])


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--perturbation", "-1", "perturbation must be"),
    ("--perturbation", "nan", "perturbation must be"),
    ("--perturbation-scale", "0", "perturbation-scale must be"),
])
def test_bad_perturbation_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, words: str
) -> None:
    out = tmp_path / "out"
    rc = synth_main([str(out), "--nx", "8", "--ny", "4", "--members", "2", "--seed", "0",
                     flag, value])
    assert rc == 2
    assert words in capsys.readouterr().err
    assert not out.exists()

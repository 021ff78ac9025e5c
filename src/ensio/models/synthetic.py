"""The synthetic global problem of Zheng et al. (offline EnKF framework).

Why this module exists: the I/O benchmarks and the end-to-end tests need an
ensemble whose size can be dialled from kilobytes to many gigabytes, whose
truth is known in closed form, and whose members differ in a way an analysis
can correct. The seed paper's problem does exactly that: on a global
``ny × nx`` lat/lon grid with ``Δx = 2π/nx`` and ``Δy = π/ny``

.. math::

    x^t(j, i) = \\sin^2\\!\\left(-3 + \\frac{4 i Δx}{2π - Δx}\\right)
                \\cos^3\\!\\left(-2 + \\frac{4 j Δy}{π - Δy}\\right)

and member ``k`` shifts the longitude argument by ``Δs_k ~ U[-0.5, 0.5]``
(``sin²(-3 + Δs_k + …)``). The field is separable, so every member is one
outer product of two 1-D vectors: generating a 3600 × 1800 member costs a few
tens of milliseconds and the run is bounded by the file system.

Files written by :func:`write_synthetic` into ``OUT``:

* ``mem001.nc`` … ``memNNN.nc`` — ``lon(lon)``, ``lat(lat)`` (degrees, CF
  units), ``state(lat, lon)`` (or ``state(lev, lat, lon)`` with levels) and
  ``aux(lat, lon)``, member-dependent noise that stands for everything an
  analysis must leave untouched;
* ``truth.nc`` — the same coordinates and ``state``;
* ``obs.nc`` — observations in the format of DESIGN.md (dimension ``obs``;
  ``lon``, ``lat``, ``value``, ``error``, ``index``; plus ``level`` with levels);
* ``ensio.yaml`` — a ready config: the ensemble, ``obs.nc`` and an LETKF whose
  support radius is :data:`LOCALIZATION_CELLS` grid spacings, writing
  ``an/mean.nc`` and ``an/spread.nc``; ``ensio analyse ensio.yaml`` runs it as is.

With ``perturbation = A > 0`` every member also gets ``A ×`` its own smooth
random field (:func:`ensio.models.smoothnoise.smooth_field`: white noise
under a Gaussian of ``perturbation_scale`` grid points, periodic in
longitude, one independent field per level), so that the anomalies are
locally full-rank like a real ensemble's instead of spanning the two
dimensions of a phase shift. ``A = 0`` (the default) writes exactly what
the seed's problem always was, bit for bit.

Levels are not part of the paper's (2-D) problem; they exist so benchmarks can
exercise 3-D variables. Level ``l`` of ``L`` holds the 2-D field times
``1 + l / L`` so that levels are distinguishable (a transposed read shows up).

Randomness: one :class:`numpy.random.SeedSequence` from ``seed`` is spawned
into independent streams for the shifts, the observations, each member's
auxiliary noise and (a fourth child, drawn only when ``A > 0``) each member's
perturbation, so the same seed gives the same data bit for bit, changing
the number of members does not change the observations, and turning the
perturbation on changes nothing but ``state``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import netCDF4
import numpy as np

from .smoothnoise import smooth_field

__all__ = [
    "LOCALIZATION_CELLS",
    "OBS_ERROR",
    "OBS_FRACTION_PERMILLE",
    "SyntheticCase",
    "SyntheticSpec",
    "field",
    "grid",
    "level_factors",
    "localization_radius_km",
    "member_shifts",
    "member_perturbation",
    "n_observations",
    "observations",
    "perturbation_streams",
    "spacing_km",
    "write_synthetic",
]

#: Standard deviation of the observation error (and of the added noise).
OBS_ERROR = 0.25
#: Fraction of the state entries observed, in per mille (integer, to round exactly).
OBS_FRACTION_PERMILLE = 100
#: Support radius of the LETKF in the written config, in grid spacings: with
#: 10 % of the points observed about 20 observations fall inside it.
LOCALIZATION_CELLS = 8
#: Earth radius of the localization distances (DESIGN.md), km.
EARTH_RADIUS_KM = 6371.0
#: File name pattern of the members (1-based, as everywhere in ensio).
MEMBER_PATTERN = "mem{member:03d}.nc"

Format = Literal["netcdf4", "cdf5"]
DType = Literal["float64", "float32"]

_NC_FORMAT: dict[str, str] = {"netcdf4": "NETCDF4", "cdf5": "NETCDF3_64BIT_DATA"}


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of one synthetic case.

    Attributes
    ----------
    nx, ny : int
        Grid size in longitude and latitude (each ≥ 2: the formula divides by
        ``2π - Δx`` and ``π - Δy``).
    members : int
        Ensemble size N_e.
    seed : int
        Seed of every random draw (shifts, observations, auxiliary noise).
    format : {"netcdf4", "cdf5"}
        ``netcdf4`` writes contiguous (unchunked, uncompressed) HDF5 datasets
        so the raw fast path applies; ``cdf5`` is NETCDF3_64BIT_DATA.
    dtype : {"float64", "float32"}
        On-disk dtype of ``state`` and ``aux``.
    levels : int or None
        ``None``: 2-D ``state(lat, lon)``; otherwise ``state(lev, lat, lon)``.
    perturbation : float
        Standard deviation A of the smooth random field added to each
        member's ``state`` (0: none, the paper's members unchanged).
    perturbation_scale : float
        Standard deviation of its Gaussian smoothing kernel, in grid points.
    """

    nx: int
    ny: int
    members: int
    seed: int
    format: Format = "netcdf4"
    dtype: DType = "float64"
    levels: int | None = None
    perturbation: float = 0.0
    perturbation_scale: float = 4.0

    def __post_init__(self) -> None:
        if self.nx < 2 or self.ny < 2:
            raise ValueError(f"grid must be at least 2 x 2, got nx={self.nx}, ny={self.ny}")
        if self.members < 1:
            raise ValueError(f"members must be at least 1, got {self.members}")
        if self.levels is not None and self.levels < 1:
            raise ValueError(f"levels must be at least 1, got {self.levels}")
        if self.format not in _NC_FORMAT:
            raise ValueError(f"format {self.format!r} is not one of {' | '.join(_NC_FORMAT)}")
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"dtype {self.dtype!r} is not one of float64 | float32")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")
        if not (self.perturbation >= 0 and np.isfinite(self.perturbation)):
            raise ValueError(f"perturbation must be a finite number >= 0, got {self.perturbation}")
        if not (self.perturbation_scale > 0 and np.isfinite(self.perturbation_scale)):
            raise ValueError(
                f"perturbation-scale must be a finite number > 0, got {self.perturbation_scale}"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of ``state`` as stored."""
        hor = (self.ny, self.nx)
        return hor if self.levels is None else (self.levels, *hor)

    @property
    def n_state(self) -> int:
        """Length N_x of the state vector."""
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class SyntheticCase:
    """What :func:`write_synthetic` produced."""

    directory: Path
    members: tuple[Path, ...]
    truth: Path
    obs: Path
    config: Path
    shifts: np.ndarray
    n_obs: int


def grid(nx: int, ny: int) -> tuple[np.ndarray, np.ndarray]:
    """Longitudes ``i·360/nx`` and cell-centre latitudes ``-90 + (j+½)·180/ny``, degrees."""
    lon = np.arange(nx, dtype=np.float64) * (360.0 / nx)
    lat = -90.0 + (np.arange(ny, dtype=np.float64) + 0.5) * (180.0 / ny)
    return lon, lat


def level_factors(levels: int | None) -> np.ndarray:
    """Amplitude ``1 + l/L`` of each level (``[1.0]`` for a 2-D state)."""
    if levels is None:
        return np.ones(1)
    return 1.0 + np.arange(levels, dtype=np.float64) / levels


def field(nx: int, ny: int, shift: float = 0.0, levels: int | None = None) -> np.ndarray:
    """The paper's field with its longitude argument shifted by ``shift`` (float64).

    Returns
    -------
    numpy.ndarray
        ``(ny, nx)``, or ``(levels, ny, nx)`` when ``levels`` is given.
    """
    dx = 2.0 * np.pi / nx
    dy = np.pi / ny
    i = np.arange(nx, dtype=np.float64)
    j = np.arange(ny, dtype=np.float64)
    fx = np.sin(-3.0 + shift + 4.0 * i * dx / (2.0 * np.pi - dx)) ** 2
    gy = np.cos(-2.0 + 4.0 * j * dy / (np.pi - dy)) ** 3
    f2 = np.outer(gy, fx)
    if levels is None:
        return f2
    return level_factors(levels)[:, None, None] * f2[None, :, :]


def _streams(seed: int, members: int) -> tuple[np.random.Generator, np.random.Generator,
                                                list[np.random.Generator]]:
    """Independent generators: shifts, observations, one per member (auxiliary noise)."""
    ss = np.random.SeedSequence(seed)
    s_shift, s_obs, s_aux = ss.spawn(3)
    aux = [np.random.default_rng(s) for s in s_aux.spawn(members)]
    return np.random.default_rng(s_shift), np.random.default_rng(s_obs), aux


def perturbation_streams(seed: int, members: int) -> list[np.random.Generator]:
    """One generator per member for its smooth perturbation (the seed's fourth child).

    ``SeedSequence.spawn`` numbers its children, so the first three streams
    (:func:`_streams`) are the same whether or not this one is drawn.
    """
    s_pert = np.random.SeedSequence(seed).spawn(4)[3]
    return [np.random.default_rng(s) for s in s_pert.spawn(members)]


def member_perturbation(spec: SyntheticSpec, rng: np.random.Generator) -> np.ndarray:
    """``A ×`` the smooth field of one member, shaped like ``state`` (float64).

    One independent field per level: each level of a 3-D state is full-rank
    on its own.
    """
    count = 1 if spec.levels is None else spec.levels
    f = smooth_field(rng, spec.ny, spec.nx, spec.perturbation_scale, count)
    return spec.perturbation * (f[0] if spec.levels is None else f)


def member_shifts(seed: int, members: int) -> np.ndarray:
    """Longitude-argument shifts ``Δs_k ~ U[-0.5, 0.5]``, k = 1..members (index k-1)."""
    return _streams(seed, members)[0].uniform(-0.5, 0.5, size=members)


def n_observations(n_state: int) -> int:
    """10 % of the state entries, rounded half up: ``(n_state + 5) // 10`` (at least 1)."""
    return max(1, (n_state * OBS_FRACTION_PERMILLE + 500) // 1000)


def observations(truth: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Draw 10 % of the state entries without replacement and perturb them.

    Parameters
    ----------
    truth : numpy.ndarray
        The true state as stored, ``(ny, nx)`` or ``(L, ny, nx)``.
    rng : numpy.random.Generator
        The observation stream.

    Returns
    -------
    dict
        ``index`` (int64, sorted ascending so readers walk the state in order),
        ``value`` = truth + N(0, 0.25²), ``error`` = 0.25, ``lon``/``lat``
        (degrees) of each observed point, and ``level`` (index) for 3-D states.
    """
    n = truth.size
    idx = np.sort(rng.choice(n, size=n_observations(n), replace=False)).astype(np.int64)
    ny, nx = truth.shape[-2:]
    lon, lat = grid(nx, ny)
    flat = truth.reshape(-1).astype(np.float64)
    out = {
        "index": idx,
        "value": flat[idx] + rng.normal(0.0, OBS_ERROR, size=idx.size),
        "error": np.full(idx.size, OBS_ERROR),
        "lon": lon[idx % nx],
        "lat": lat[(idx // nx) % ny],
    }
    if truth.ndim == 3:
        out["level"] = (idx // (nx * ny)).astype(np.int64)
    return out


def _create(path: Path, spec: SyntheticSpec, attrs: dict[str, object],
            aux: bool) -> netCDF4.Dataset:
    """Define the whole file (dims, coordinates, ``state``, optional ``aux``, attrs).

    Everything is defined before the first data write: for classic files a
    later redefinition would make the library move data around.
    """
    ds = netCDF4.Dataset(path, "w", format=_NC_FORMAT[spec.format])
    # Fill mode off: every byte of every variable is written exactly once, so
    # pre-filling would double the I/O of big members for nothing.
    ds.set_fill_off()
    ds.setncatts(attrs)
    ds.createDimension("lon", spec.nx)
    ds.createDimension("lat", spec.ny)
    vlon = ds.createVariable("lon", "f8", ("lon",))
    vlon.setncatts({"units": "degrees_east", "standard_name": "longitude"})
    vlat = ds.createVariable("lat", "f8", ("lat",))
    vlat.setncatts({"units": "degrees_north", "standard_name": "latitude"})
    dims: tuple[str, ...] = ("lat", "lon")
    if spec.levels is not None:
        ds.createDimension("lev", spec.levels)
        vlev = ds.createVariable("lev", "f8", ("lev",))
        vlev.setncatts({"units": "1", "long_name": "model level index", "positive": "down"})
        dims = ("lev", *dims)
    _var(ds, "state", spec, dims).long_name = "synthetic state (Zheng et al.)"
    if aux:
        _var(ds, "aux", spec, ("lat", "lon")).long_name = (
            "auxiliary variable: no analysis may change it"
        )
    lon, lat = grid(spec.nx, spec.ny)
    vlon[:] = lon
    vlat[:] = lat
    if spec.levels is not None:
        vlev[:] = np.arange(spec.levels, dtype=np.float64)
    return ds


def _var(ds: netCDF4.Dataset, name: str, spec: SyntheticSpec,
         dims: tuple[str, ...]) -> netCDF4.Variable:
    """A variable stored contiguously (netCDF-4) so the raw byte-range path applies."""
    kw = {"contiguous": True} if spec.format == "netcdf4" else {}
    return ds.createVariable(name, spec.dtype, dims, **kw)


def _write_obs(path: Path, obs: dict[str, np.ndarray]) -> None:
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("obs", obs["index"].size)
        attrs = {
            "lon": {"units": "degrees_east", "standard_name": "longitude"},
            "lat": {"units": "degrees_north", "standard_name": "latitude"},
            "value": {"long_name": "observed value of state"},
            "error": {"long_name": "observation error standard deviation"},
            "index": {"long_name": "0-based state-vector index (lat-major C order)"},
            "level": {"long_name": "0-based model level index"},
        }
        for name, values in obs.items():
            v = ds.createVariable(name, "i8" if values.dtype.kind == "i" else "f8", ("obs",))
            v.setncatts(attrs[name])
            v[:] = values
        ds.description = "synthetic observations: truth + N(0, 0.25^2) at 10 % of the points"


def _config_text(spec: SyntheticSpec) -> str:
    """``ensio.yaml`` for the case; every key exists in :mod:`ensio.config.schema`."""
    level = ", level: lev" if spec.levels is not None else ""
    return (
        f"# Synthetic case (ensio synth): {spec.ny} x {spec.nx} grid"
        f"{'' if spec.levels is None else f' x {spec.levels} levels'}, {spec.members} members,"
        f" {spec.format}, {spec.dtype}, seed {spec.seed}"
        f"{_perturbation_note(spec)}.\n"
        "# Relative paths are resolved against this file's directory.\n"
        "ensemble:\n"
        f"  members: \"{MEMBER_PATTERN}\"\n"
        f"  size: {spec.members}\n"
        "  variables: [state]\n"
        f"  coordinates: {{lon: lon, lat: lat{level}}}\n"
        "io:\n"
        "  # tasks: N_io; unset means min(N_mpi, N_e)\n"
        "  journal: true\n"
        "  fsync: false\n"
        "# ensio analyse: obs.nc (10 % of the points, sigma 0.25, with state-vector index)\n"
        "observations: [obs.nc]\n"
        "analysis:\n"
        "  filter: letkf\n"
        f"  # support radius: {LOCALIZATION_CELLS} grid spacings "
        f"({spacing_km(spec.nx, spec.ny):.0f} km at the equator)\n"
        f"  localization: {{taper: gaspari-cohn, radius_km: {localization_radius_km(spec):.0f}}}\n"
        "output:\n"
        "  mean: an/mean.nc\n"
        "  spread: an/spread.nc\n"
    )


def _perturbation_note(spec: SyntheticSpec) -> str:
    """The config header's mention of the perturbation (empty when A = 0)."""
    if spec.perturbation == 0:
        return ""
    return (f", smooth perturbation A = {spec.perturbation:g}"
            f" (scale {spec.perturbation_scale:g} grid points)")


def spacing_km(nx: int, ny: int) -> float:
    """The larger grid spacing at the equator, km (6371 km sphere): max(2πR/nx, πR/ny)."""
    return max(2.0 * np.pi * EARTH_RADIUS_KM / nx, np.pi * EARTH_RADIUS_KM / ny)


def localization_radius_km(spec: SyntheticSpec) -> float:
    """Support radius of the written config: ``LOCALIZATION_CELLS`` grid spacings, rounded."""
    return float(np.ceil(LOCALIZATION_CELLS * spacing_km(spec.nx, spec.ny)))


def write_synthetic(
    out: str | Path,
    spec: SyntheticSpec,
    on_member: Callable[[int], None] | None = None,
) -> SyntheticCase:
    """Write the whole synthetic case into directory ``out`` (created if needed).

    Each member is computed as one vectorized array and written with a single
    call, so the cost is dominated by the file system. Existing files of the
    same names are overwritten.

    Parameters
    ----------
    out : path
        Output directory.
    spec : SyntheticSpec
    on_member : callable, optional
        Called with the 1-based member number after each member file is
        written (the CLI drives a progress bar with it; the library prints
        nothing).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _, obs_rng, aux_rngs = _streams(spec.seed, spec.members)
    shifts = member_shifts(spec.seed, spec.members)
    perturbed = spec.perturbation > 0
    pert_rngs = perturbation_streams(spec.seed, spec.members) if perturbed else []
    dt = np.dtype(spec.dtype)

    truth = field(spec.nx, spec.ny, 0.0, spec.levels).astype(dt)
    truth_path = out / "truth.nc"
    with _create(truth_path, spec, {"description": "synthetic truth"}, aux=False) as ds:
        ds["state"][:] = truth
    obs = observations(truth, obs_rng)
    obs_path = out / "obs.nc"
    _write_obs(obs_path, obs)
    del truth

    paths = []
    for k in range(1, spec.members + 1):
        path = out / MEMBER_PATTERN.format(member=k)
        shift = float(shifts[k - 1])
        attrs = {"description": "synthetic ensemble member", "member": np.int32(k),
                 "shift": shift}
        state = field(spec.nx, spec.ny, shift, spec.levels)
        if perturbed:  # A = 0 adds neither the field nor the attributes: bit for bit as before
            attrs.update(perturbation=spec.perturbation,
                         perturbation_scale=spec.perturbation_scale)
            state = state + member_perturbation(spec, pert_rngs[k - 1])
        with _create(path, spec, attrs, aux=True) as ds:
            ds["state"][:] = state.astype(dt)
            ds["aux"][:] = aux_rngs[k - 1].standard_normal((spec.ny, spec.nx)).astype(dt)
        paths.append(path)
        if on_member is not None:
            on_member(k)

    config_path = out / "ensio.yaml"
    config_path.write_text(_config_text(spec))
    return SyntheticCase(
        directory=out,
        members=tuple(paths),
        truth=truth_path,
        obs=obs_path,
        config=config_path,
        shifts=shifts,
        n_obs=int(obs["index"].size),
    )

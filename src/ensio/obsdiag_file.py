"""The observation-space diagnostics file of an analysis: write it, read its summary.

One netCDF-4 file per analysis (``output.diagnostics``; in a cycle of
``ensio cycle`` ``DIR/cycle_CCC/diag.nc``), CF-1.8, ``featureType = point``:

* per observation (dim ``obs``, in global-id order): ``omb`` (O − mean
  H(x^b)), ``oma`` (O − mean H(x^a)), ``spread_b``, ``spread_a``, ``qc``
  (flag, :data:`~ensio.obs.qc.QC_FLAGS`), ``obs_type`` (observed variable: a
  flag, its values index the global attribute ``state_variables``), ``lon``, ``lat``, ``level``,
  ``level_index``, ``value``, ``error``, ``obs_id``;
* per type (dim ``type``: each observed variable, then ``all``):
  ``type_name``, ``n_obs``, ``n_used``, ``omb_mean``, ``omb_rms``,
  ``oma_mean``, ``oma_rms``, ``spread_b_rms``, ``spread_a_rms``, ``error_rms``,
  ``consistency``.

It lives at the top of the package beside :mod:`ensio.offline` because it
joins the analysis's statistics (:mod:`ensio.analysis.obsdiag`, which knows no
files) with a file, and the io rooms may not import the analysis. The file has
no wall-clock time in it, so two runs of the same analysis (any number of
ranks) write the same numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
from mpi4py import MPI

from . import __version__
from .analysis.obsdiag import ObsDiagnostics, TypeStats, gather_diagnostics, type_statistics
from .config.analysis import OutputSection
from .durable import replacing
from .errors import InputError, file_op
from .obs import QC_FLAGS
from .parallel.agree import root_call

__all__ = [
    "DIAG_TYPE_FIELDS",
    "diagnostics_path",
    "read_type_statistics",
    "write_diagnostics",
    "write_run_diagnostics",
]

#: The per-type variables, in the order ``ensio report`` shows them.
DIAG_TYPE_FIELDS = ("n_obs", "n_used", "omb_mean", "omb_rms", "oma_mean", "oma_rms",
                    "spread_b_rms", "spread_a_rms", "error_rms", "consistency")  # fmt: skip


def diagnostics_path(output: OutputSection, base_dir: Path, cycle: int) -> Path | None:
    """Where this analysis's diagnostics go (``output.diagnostics``); None: not written."""
    d = output.diagnostics
    if d is False:
        return None
    if isinstance(d, str):
        p = Path(d.format(cycle=cycle))
        return p if p.is_absolute() else base_dir / p
    beside = output.mean
    where = base_dir if beside is None else (base_dir / beside).parent
    return where / f"diag_{cycle:03d}.nc"


def _flag_word(name: str) -> str:
    """A variable name as a CF flag meaning (letters, digits, ``_ . - + @``)."""
    return re.sub(r"[^A-Za-z0-9_.+@-]", "_", name)


def _var(ds: netCDF4.Dataset, name: str, data: np.ndarray, dims: tuple[str, ...],
         **attrs: Any) -> None:  # fmt: skip
    """One variable; floats get a NaN ``_FillValue`` (NaN where not defined)."""
    data = np.asarray(data)
    fill = np.nan if data.dtype.kind == "f" else None
    v = ds.createVariable(name, data.dtype, dims, fill_value=fill)
    v.setncatts(attrs)
    v[...] = data


def write_diagnostics(
    path: Path, diag: ObsDiagnostics, names: Sequence[str], *,
    cycle: int, members: int, command: str, four_d: bool = False,
) -> list[TypeStats]:  # fmt: skip
    """Write the diagnostics file atomically (a crash leaves the old file or the new one).

    ``names``: the layout's variable names (``diag.variable`` indexes them).
    Returns the per-type statistics written.
    """
    stats = type_statistics(diag, names)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_op("write", path), replacing(path, label="diagnostics") as tmp:
        with netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
            _fill(ds, diag, names, stats, four_d)
            ds.setncatts({
                "Conventions": "CF-1.8",
                "featureType": "point",
                "title": "ensio observation-space diagnostics",
                "source": f"ensio {__version__}",
                "history": command,
                "cycle": np.int32(cycle),
                "ensemble_size": np.int32(members),
                "qc_flags": " ".join(QC_FLAGS),
                "comment": (
                    "omb = value - mean H(x^b), oma = value - mean H(x^a); spreads are "
                    "ensemble standard deviations (ddof 1) of H(x); per-type statistics "
                    "over the accepted observations (qc = 0); consistency = "
                    "mean(omb^2) / mean(error^2 + spread_b^2)"
                    + ("; 4-D analysis: H(x^a) is at the analysis time" if four_d else "")
                ),
            })  # fmt: skip
    return stats


def _fill(ds: netCDF4.Dataset, diag: ObsDiagnostics, names: Sequence[str],
          stats: list[TypeStats], four_d: bool) -> None:  # fmt: skip
    """Dimensions and variables of the file (see the module docstring)."""
    ds.createDimension("obs", len(diag))
    ds.createDimension("type", len(stats))
    obs = ("obs",)
    kinds = list(range(len(names)))
    _var(ds, "obs_id", diag.ids, obs, long_name="global observation number (0-based, "
         "files in config order)")
    _var(ds, "lon", diag.lon, obs, standard_name="longitude", units="degrees_east",
         long_name="observation longitude")
    _var(ds, "lat", diag.lat, obs, standard_name="latitude", units="degrees_north",
         long_name="observation latitude")
    _var(ds, "level", diag.level, obs, long_name="observation level in the observed "
         "variable's level coordinate (NaN: none or given as level_index)")
    _var(ds, "level_index", diag.level_index.astype(np.int32), obs,
         long_name="observation level as a 0-based level index (-1: none)")
    ds.variables["level_index"].setncattr("missing_value", np.int32(-1))
    _var(ds, "obs_type", diag.variable.astype(np.int32), obs,
         long_name="observed state variable", flag_values=np.array(kinds, np.int32),
         flag_meanings=" ".join(_flag_word(n) for n in names),
         comment="the names are in the global attribute state_variables, in this order")
    ds.setncattr("state_variables", " ".join(names))
    _var(ds, "value", diag.value, obs, long_name="observed value",
         coordinates="lon lat level")
    _var(ds, "error", diag.error, obs, long_name="observation error standard deviation "
         "(sigma_o)", coordinates="lon lat level")
    _var(ds, "qc", diag.qc.astype(np.int8), obs, long_name="quality control",
         flag_values=np.arange(len(QC_FLAGS), dtype=np.int8),
         flag_meanings=" ".join(QC_FLAGS),
         comment="0 accepted (used by the analysis); else the first check that rejected it")
    post = " at the analysis time" if four_d else ""
    for name, data, what in (
        ("omb", diag.omb, "observation minus background: value - mean H(x^b)"),
        ("oma", diag.oma, f"observation minus analysis: value - mean H(x^a){post}"),
        ("spread_b", diag.spread_b, "background ensemble spread of H(x^b) (std, ddof 1)"),
        ("spread_a", diag.spread_a, f"analysis ensemble spread of H(x^a){post} (std, ddof 1)"),
    ):
        _var(ds, name, data, obs, long_name=what, coordinates="lon lat level",
             comment="NaN where the observation operator was not applied (qc outside, "
                     "missing_state, outside_window, bad_prior)")
    _type_variables(ds, stats)


def _type_variables(ds: netCDF4.Dataset, stats: list[TypeStats]) -> None:
    """The per-type statistics (dim ``type``; the last is ``all``)."""
    t = ("type",)
    v = ds.createVariable("type_name", str, t)
    v.long_name = "observation type: observed state variable, or all"
    v[...] = np.array([s.name for s in stats], dtype=object)
    cols: dict[str, tuple[np.ndarray, str]] = {
        "n_obs": (np.array([s.total for s in stats], np.int64), "number of observations"),
        "n_used": (np.array([s.count for s in stats], np.int64),
                   "number of accepted observations (qc = 0)"),
        "omb_mean": (np.array([s.omb.mean for s in stats]), "mean of O-B"),
        "omb_rms": (np.array([s.omb.rms for s in stats]), "root mean square of O-B"),
        "oma_mean": (np.array([s.oma.mean for s in stats]), "mean of O-A"),
        "oma_rms": (np.array([s.oma.rms for s in stats]), "root mean square of O-A"),
        "spread_b_rms": (np.array([s.spread_b for s in stats]),
                         "background spread in observation space, sqrt(mean spread_b^2)"),
        "spread_a_rms": (np.array([s.spread_a for s in stats]),
                         "analysis spread in observation space, sqrt(mean spread_a^2)"),
        "error_rms": (np.array([s.error for s in stats]), "sqrt(mean error^2)"),
        "consistency": (np.array([s.consistency for s in stats]),
                        "consistency ratio mean(omb^2) / mean(error^2 + spread_b^2)"),
    }
    for n in DIAG_TYPE_FIELDS:
        data, what = cols[n]
        over = "" if n in ("n_obs", "n_used") else " over the accepted observations"
        _var(ds, n, data, t, long_name=what + over,
             **({"units": "1"} if n in ("n_obs", "n_used", "consistency") else {}))


def read_type_statistics(path: Path) -> list[dict[str, Any]]:
    """The per-type rows of a diagnostics file: ``{"type": name, field: value, ...}``.

    Raises
    ------
    InputError
        The file is not a readable diagnostics file (naming it and what is missing).
    """
    try:
        with netCDF4.Dataset(path) as ds:
            missing = [n for n in ("type_name", *DIAG_TYPE_FIELDS) if n not in ds.variables]
            if missing:
                raise InputError(f"{path}: not an ensio diagnostics file (variable "
                                 f"'{missing[0]}' missing)")
            names = [str(x) for x in ds.variables["type_name"][:]]
            cols = {f: np.ma.filled(ds.variables[f][:].astype(float), np.nan)
                    for f in DIAG_TYPE_FIELDS}  # fmt: skip
    except OSError as exc:
        raise InputError(f"{path}: cannot read the diagnostics file ({exc})") from None
    rows = []
    for i, name in enumerate(names):
        row: dict[str, Any] = {"type": name}
        for f in DIAG_TYPE_FIELDS:
            x = float(cols[f][i])
            row[f] = int(x) if f in ("n_obs", "n_used") else x
        rows.append(row)
    return rows


def write_run_diagnostics(
    path: Path | None, result_observations: ObsDiagnostics | None, names: Sequence[str],
    comm: MPI.Comm, *, cycle: int, members: int, command: str, four_d: bool = False,
) -> None:  # fmt: skip
    """Collective: gather every rank's observations and write ``path`` on rank 0.

    Nothing when ``path`` is None. An error (e.g. an unwritable directory)
    reaches every rank as the same one-line error.
    """
    if path is None or result_observations is None:
        return
    diag = gather_diagnostics(result_observations, comm)

    def write() -> None:
        assert diag is not None and path is not None
        write_diagnostics(path, diag, names, cycle=cycle, members=members, command=command,
                          four_d=four_d)  # fmt: skip

    root_call(comm, write)

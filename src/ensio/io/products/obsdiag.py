"""The observation-space diagnostics file of an analysis: where, write, read back.

One netCDF-4 file per analysis (``output.diagnostics``; in a cycle of
``ensio cycle`` ``DIR/cycle_CCC/diag.nc``), CF-1.8, ``featureType = point``:

* per observation (dim ``obs``, in global-id order): ``omb`` (O − mean
  H(x^b)), ``oma`` (O − mean H(x^a)), ``spread_b``, ``spread_a``, ``qc``
  (a flag: 0 accepted, else the first check that rejected it), ``obs_type``
  (the observed variable: a flag whose values index the global attribute
  ``state_variables``), ``obs_file`` (the observation file: likewise into
  ``observation_files``), ``lon``, ``lat``, ``level``, ``level_index``,
  ``value``, ``error``, ``obs_id``;
* per type (dim ``type``: each observed variable, then each observation file
  as ``file NAME`` when there are several, then ``all``):
  ``type_name``, ``n_obs``, ``n_used``, ``omb_mean``, ``omb_rms``,
  ``oma_mean``, ``oma_rms``, ``spread_b_rms``, ``spread_a_rms``,
  ``error_rms``, ``consistency``.

The numbers come as plain columns and rows
(:func:`ensio.analysis.obsdiag.diagnostics_tables`: the analysis computes,
this room only writes; it may not import the analysis). The file holds no
wall-clock time, so the same analysis on any number of ranks writes the
same numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
from mpi4py import MPI

from ... import __version__
from ...config.analysis import OutputSection
from ...durable import replacing
from ...errors import InputError, file_op
from ...parallel.agree import root_call
from .products import _write_product  # one home for "cannot write X: <reason>, disk full"

__all__ = [
    "diagnostics_path",
    "read_type_statistics",
    "write_diagnostics",
    "write_run_diagnostics",
]

_COUNTS = ("n_obs", "n_used")

#: long_name of every variable (per observation, then per type).
_LONG = {
    "obs_id": "global observation number (0-based, files in config order)",
    "lon": "observation longitude",
    "lat": "observation latitude",
    "level": "observation level in the observed variable's level coordinate "
             "(NaN: none, or given as level_index)",
    "level_index": "observation level as a 0-based level index (-1: none)",
    "obs_type": "observed state variable",
    "obs_file": "observation file the observation came from",
    "value": "observed value",
    "error": "observation error standard deviation (sigma_o)",
    "qc": "quality control",
    "omb": "observation minus background: value - mean H(x^b)",
    "oma": "observation minus analysis: value - mean H(x^a)",
    "spread_b": "background ensemble spread of H(x^b) (standard deviation, ddof 1)",
    "spread_a": "analysis ensemble spread of H(x^a) (standard deviation, ddof 1)",
    "n_obs": "number of observations",
    "n_used": "number of accepted observations (qc = 0)",
    "omb_mean": "mean of O-B",
    "omb_rms": "root mean square of O-B",
    "oma_mean": "mean of O-A",
    "oma_rms": "root mean square of O-A",
    "spread_b_rms": "background spread in observation space, sqrt(mean spread_b^2)",
    "spread_a_rms": "analysis spread in observation space, sqrt(mean spread_a^2)",
    "error_rms": "sqrt(mean error^2)",
    "consistency": "consistency ratio mean(omb^2) / mean(error^2 + spread_b^2)",
}  # fmt: skip

_NAN_WHERE = ("NaN where the observation operator was not applied (qc outside, "
              "missing_state, outside_window, bad_prior)")  # fmt: skip


def diagnostics_path(output: OutputSection, base_dir: Path, cycle: int) -> Path | None:
    """Where this analysis's diagnostics go (``output.diagnostics``); None: not written.

    Unset (or true): ``diag_CCC.nc`` beside ``output.mean``, else in the
    config's directory.
    """
    d = output.diagnostics
    if d is False:
        return None
    if isinstance(d, str):
        p = Path(d.format(cycle=cycle))
        return p if p.is_absolute() else base_dir / p
    where = base_dir if output.mean is None else (base_dir / output.mean).parent
    return where / f"diag_{cycle:03d}.nc"


def _flag_word(name: str) -> str:
    """A variable name as a CF flag meaning (letters, digits, ``_ . - + @``)."""
    return re.sub(r"[^A-Za-z0-9_.+@-]", "_", name)


def _var(ds: netCDF4.Dataset, name: str, data: np.ndarray, dim: str, **attrs: Any) -> None:
    """One variable; floats get a NaN ``_FillValue`` (NaN where not defined)."""
    data = np.asarray(data)
    fill = np.nan if data.dtype.kind == "f" else None
    v = ds.createVariable(name, data.dtype, (dim,), fill_value=fill)
    v.setncatts({"long_name": _LONG[name], **attrs})
    v[...] = data


def write_diagnostics(
    path: Path, tables: Any, *, at: Path | None = None, cycle: int, members: int,
    command: str, four_d: bool = False,
) -> None:  # fmt: skip
    """Write the file ``path`` atomically at ``at`` (default ``path``; a run's transaction
    gives the staged name): a crash leaves the old file or the new one.

    ``tables`` (:class:`ensio.analysis.obsdiag.DiagTables`): ``columns``, the
    per-observation variables (see the module docstring), each (m,);
    ``rows``, per type ``type`` and the statistics, each written as a
    variable of dimension ``type``; ``names``, the state variables
    ``obs_type`` indexes; ``qc_flags``, the meaning of each ``qc`` value.
    """
    at = path if at is None else at
    with file_op("write", path):  # the directory, the rename
        at.parent.mkdir(parents=True, exist_ok=True)
        with replacing(at, label="diagnostics") as tmp:
            _write_product(path, tmp, lambda out: _write(
                out, tables, cycle=cycle, members=members, command=command, four_d=four_d))


def _write(out: Path, tables: Any, *, cycle: int, members: int, command: str,
           four_d: bool) -> None:  # fmt: skip
    """The file's contents into ``out`` (see :func:`write_diagnostics`)."""
    columns: Mapping[str, np.ndarray] = tables.columns
    names: Sequence[str] = tables.names
    with netCDF4.Dataset(out, "w", format="NETCDF4") as ds:
        _observations(ds, columns, names, tables.files, tables.qc_flags, four_d)
        _types(ds, tables.rows)
        ds.setncatts({
            "Conventions": "CF-1.8",
            "featureType": "point",
            "title": "ensio observation-space diagnostics",
            "source": f"ensio {__version__}",
            "history": command,
            "cycle": np.int32(cycle),
            "ensemble_size": np.int32(members),
            "state_variables": " ".join(names),
            "observation_files": " ".join(tables.files),
            "comment": (
                "omb = value - mean H(x^b), oma = value - mean H(x^a); spreads are "
                "ensemble standard deviations (ddof 1) of H(x); per-type statistics "
                "over the accepted observations (qc = 0); consistency = "
                "mean(omb^2) / mean(error^2 + spread_b^2)"
                + ("; 4-D analysis: H(x^a) is at the analysis time" if four_d else "")
            ),
        })  # fmt: skip


def _observations(ds: netCDF4.Dataset, columns: Mapping[str, np.ndarray], names: Sequence[str],
                  files: Sequence[str], qc_flags: Sequence[str], four_d: bool) -> None:  # fmt: skip
    """The per-observation variables (dim ``obs``)."""
    ds.createDimension("obs", len(columns["obs_id"]))
    c = columns
    where = {"coordinates": "lon lat level"}
    _var(ds, "obs_id", np.asarray(c["obs_id"], np.int64), "obs")
    _var(ds, "lon", c["lon"], "obs", standard_name="longitude", units="degrees_east")
    _var(ds, "lat", c["lat"], "obs", standard_name="latitude", units="degrees_north")
    _var(ds, "level", c["level"], "obs")
    _var(ds, "level_index", np.asarray(c["level_index"], np.int32), "obs",
         missing_value=np.int32(-1))  # fmt: skip
    _var(ds, "obs_type", np.asarray(c["obs_type"], np.int32), "obs",
         flag_values=np.arange(len(names), dtype=np.int32),
         flag_meanings=" ".join(_flag_word(n) for n in names),
         comment="in the order of the global attribute state_variables")  # fmt: skip
    _var(ds, "obs_file", np.asarray(c["obs_file"], np.int32), "obs",
         flag_values=np.arange(len(files), dtype=np.int32),
         flag_meanings=" ".join(_flag_word(f) for f in files),
         comment="in the order of the global attribute observation_files")  # fmt: skip
    _var(ds, "value", c["value"], "obs", **where)
    _var(ds, "error", c["error"], "obs", **where)
    _var(ds, "qc", np.asarray(c["qc"], np.int8), "obs",
         flag_values=np.arange(len(qc_flags), dtype=np.int8),
         flag_meanings=" ".join(qc_flags),
         comment="0 accepted (used by the analysis); else the first check that rejected it")
    post = {"comment": _NAN_WHERE + ("; H(x^a) at the analysis time" if four_d else "")}
    for name in ("omb", "spread_b"):
        _var(ds, name, c[name], "obs", comment=_NAN_WHERE, **where)
    for name in ("oma", "spread_a"):
        _var(ds, name, c[name], "obs", **post, **where)


def _types(ds: netCDF4.Dataset, rows: Sequence[Mapping[str, Any]]) -> None:
    """The per-type statistics (dim ``type``; the last row is ``all``)."""
    ds.createDimension("type", len(rows))
    v = ds.createVariable("type_name", str, ("type",))
    v.long_name = "observation type: observed state variable, or all"
    v[...] = np.array([r["type"] for r in rows], dtype=object)
    for n in (k for k in rows[0] if k != "type"):
        data = np.array([r[n] for r in rows], np.int64 if n in _COUNTS else float)
        extra = {"units": "1"} if n in (*_COUNTS, "consistency") else {}
        if n not in _COUNTS:
            extra["comment"] = "over the accepted observations (qc = 0)"
        _var(ds, n, data, "type", **extra)


def read_type_statistics(path: Path) -> list[dict[str, Any]]:
    """The per-type rows of a diagnostics file: ``{"type": name, statistic: value, ...}``
    (every variable of dimension ``type``, in the file's order).

    Raises
    ------
    InputError
        The file is not a readable diagnostics file (one line naming it).
    """
    try:
        with netCDF4.Dataset(path) as ds:
            if "type_name" not in ds.variables:
                raise InputError(f"{path}: not an ensio diagnostics file (variable "
                                 "'type_name' missing)")  # fmt: skip
            names = [str(x) for x in ds.variables["type_name"][:]]
            cols = {n: np.ma.filled(v[:].astype(float), np.nan)
                    for n, v in ds.variables.items()
                    if v.dimensions == ("type",) and n != "type_name"}  # fmt: skip
    except OSError as exc:
        raise InputError(f"{path}: cannot read the diagnostics file ({exc})") from None
    rows = []
    for i, name in enumerate(names):
        row: dict[str, Any] = {"type": name}
        for f in cols:
            x = float(cols[f][i])
            row[f] = int(x) if f in _COUNTS else x
        rows.append(row)
    return rows


def write_run_diagnostics(path: Path | None, tables: Any, comm: MPI.Comm, **attrs: Any) -> None:
    """Collective: rank 0 writes ``path`` from the gathered ``tables`` (``DiagTables``).

    Nothing when ``path`` is None. An error (e.g. an unwritable directory)
    reaches every rank as the same one-line error. ``attrs``: the keywords of
    :func:`write_diagnostics`.
    """
    if path is None:
        return

    def write() -> None:
        assert tables is not None and path is not None
        write_diagnostics(path, tables, **attrs)

    root_call(comm, write)

"""Observation-space diagnostics: O−B, O−A and ensemble spread per observation and per type.

The pipeline (:func:`~ensio.analysis.pipeline.analyse_rows`) already has
the observed prior H(x^b) of every observation and applies H to the
analysis for its innovation statistics; :func:`observation_diagnostics`
keeps, for the observations a rank *owns*, what a diagnostics file needs
from those two ensembles (means and spreads, not the members), so no second
pass over the members is made. :func:`gather_diagnostics` brings the owned
pieces to one rank in global-id order, so the file and every statistic
(:func:`type_statistics`, computed from the gathered, sorted observations)
is the same for any number of ranks. :func:`diagnostics_tables` turns them
into the plain columns and rows the file holds; writing the file is not the
analysis's business (it knows no files): :mod:`ensio.io.products.obsdiag`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from ..obs import QC_FLAGS, ObsBatch
from .result import InnovationStats

__all__ = [
    "ObsDiagnostics",
    "DiagTables",
    "TypeStats",
    "diagnostics_tables",
    "gather_diagnostics",
    "file_of",
    "gathered_tables",
    "observation_diagnostics",
    "observed_variable",
    "TYPE_FIELDS",
    "type_statistics",
]

#: Flags whose observation operator was not applied (or read missing state):
#: their H(x) means nothing, so their O−B, O−A and spreads are NaN.
_NO_HX = tuple(QC_FLAGS.index(f) for f in ("outside", "missing_state", "outside_window",
                                            "bad_prior"))  # fmt: skip


@dataclass(frozen=True, eq=False)
class ObsDiagnostics:
    """Per observation, what the diagnostics file holds (one entry per observation).

    Attributes
    ----------
    ids : ndarray of int64, shape (m,)
        Global observation numbers.
    variable : ndarray of int64, shape (m,)
        Observed state variable (position in the layout, config order).
    lon, lat, level, value, error : ndarray, shape (m,)
        ``level`` NaN where the observation gives none (or a level index).
    level_index : ndarray of int64, shape (m,)
        -1 where the observation gives none.
    qc : ndarray of int8, shape (m,)
        :data:`~ensio.obs.qc.QC_FLAGS` codes (0 accepted).
    mean_b, spread_b, mean_a, spread_a : ndarray, shape (m,)
        Ensemble mean and standard deviation (ddof 1) of H(x) for the prior
        and the analysis; NaN where H was not applied (:data:`_NO_HX`).
    """

    ids: np.ndarray
    variable: np.ndarray
    lon: np.ndarray
    lat: np.ndarray
    level: np.ndarray
    level_index: np.ndarray
    value: np.ndarray
    error: np.ndarray
    qc: np.ndarray
    mean_b: np.ndarray
    spread_b: np.ndarray
    mean_a: np.ndarray
    spread_a: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def omb(self) -> np.ndarray:
        """O − mean H(x^b), shape (m,)."""
        return self.value - self.mean_b

    @property
    def oma(self) -> np.ndarray:
        """O − mean H(x^a), shape (m,)."""
        return self.value - self.mean_a

    @property
    def accepted(self) -> np.ndarray:
        """Mask of the observations the analysis used, shape (m,)."""
        return self.qc == 0

    def subset(self, sel: np.ndarray) -> ObsDiagnostics:
        """The observations selected by a mask or an index array."""
        return ObsDiagnostics(**{f.name: getattr(self, f.name)[sel]
                                 for f in dataclasses.fields(self)})  # fmt: skip

    @staticmethod
    def concat(parts: Sequence[ObsDiagnostics]) -> ObsDiagnostics:
        """The parts' observations together, in global-id order."""
        if not parts:
            return _empty()
        joined = ObsDiagnostics(**{
            f.name: np.concatenate([getattr(p, f.name) for p in parts])
            for f in dataclasses.fields(ObsDiagnostics)
        })  # fmt: skip
        return joined.subset(np.argsort(joined.ids, kind="stable"))


def _empty() -> ObsDiagnostics:
    f, i = np.zeros(0), np.zeros(0, np.int64)
    return ObsDiagnostics(i, i, f, f, f, i, f, f, np.zeros(0, np.int8), f, f, f, f)


def _mean_spread(hx: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and ddof-1 standard deviation over members of ``hx`` (k, m); NaN where not valid.

    Over every column, then masked: a column's numbers never depend on which other
    columns a rank holds (the reductions run down the member axis).
    """
    k, m = hx.shape
    if k == 0 or m == 0:
        return np.full(m, np.nan), np.full(m, np.nan)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = hx.mean(axis=0)
        spread = np.sqrt(hx.var(axis=0, ddof=1)) if k > 1 else np.zeros(m)
    return np.where(valid, mean, np.nan), np.where(valid, spread, np.nan)


def observed_variable(obs: ObsBatch, offsets: Sequence[int]) -> np.ndarray:
    """Pure: the state variable each observation observes, shape (m,).

    That of the row it indexes (``index`` ≥ 0; a file's index may reach any
    variable), else its ``variable`` (the first when none). ``offsets``: the
    first row of each layout variable, ascending.
    """
    m = len(obs)
    kind = np.zeros(m, np.int64) if obs.variable is None else np.maximum(obs.variable, 0)
    if obs.index is not None and len(offsets):
        hit = obs.index >= 0
        kind = np.where(hit, np.searchsorted(np.asarray(offsets), obs.index, side="right") - 1,
                        kind)  # fmt: skip
    return kind.astype(np.int64)


def observation_diagnostics(
    obs: ObsBatch, flags: np.ndarray, hx_b: np.ndarray, hx_a: np.ndarray,
    offsets: Sequence[int] = (),
) -> ObsDiagnostics:  # fmt: skip
    """Pure: the diagnostics of a set of observations from their prior and analysis H(x).

    Parameters
    ----------
    obs : ObsBatch
        m observations (ids global).
    flags : ndarray of int8, shape (m,)
        Their quality-control codes (:func:`~ensio.obs.qc.quality_flags`).
    hx_b, hx_a : ndarray, shape (k, m)
        H applied to every prior and every analysis member.
    offsets : sequence of int
        First row of each state variable (:func:`observed_variable`).
    """
    m = len(obs)
    flags = np.asarray(flags, dtype=np.int8)
    valid = ~np.isin(flags, _NO_HX)
    mean_b, spread_b = _mean_spread(np.asarray(hx_b, dtype=float), valid)
    mean_a, spread_a = _mean_spread(np.asarray(hx_a, dtype=float), valid)
    assert obs.ids is not None
    return ObsDiagnostics(
        ids=obs.ids.astype(np.int64),
        variable=observed_variable(obs, offsets),
        lon=obs.lon.astype(float),
        lat=obs.lat.astype(float),
        level=obs.level.astype(float) if obs.level is not None else np.full(m, np.nan),
        level_index=(obs.level_index.astype(np.int64) if obs.level_index is not None
                     else np.full(m, -1, np.int64)),  # fmt: skip
        value=obs.values.astype(float),
        error=obs.errors.astype(float),
        qc=flags,
        mean_b=mean_b,
        spread_b=spread_b,
        mean_a=mean_a,
        spread_a=spread_a,
    )


def gather_diagnostics(
    local: ObsDiagnostics, comm: MPI.Comm, root: int = 0
) -> ObsDiagnostics | None:
    """Collective: every rank's owned observations on ``root`` in global-id order (None elsewhere).

    Each observation has exactly one owner, so the result holds each once and
    does not depend on the number of ranks.
    """
    parts = comm.gather(local, root=root)
    return None if parts is None else ObsDiagnostics.concat(parts)


@dataclass(frozen=True)
class TypeStats:
    """Statistics of one observation type (an observed variable, or ``all``).

    Over the accepted observations (``count`` of ``total``): ``omb`` and
    ``oma`` the mean and RMS of O−B and O−A; ``spread_b``, ``spread_a`` and
    ``error`` the root-mean-square ensemble spread and σ_o (the square root
    of the mean variance, the number an RMS innovation is compared with);
    ``consistency`` = mean((O−B)²) / mean(σ_o² + spread_b²), about 1 for an
    ensemble whose spread and assumed errors match its innovations.
    """

    name: str
    total: int
    count: int
    omb: InnovationStats
    oma: InnovationStats
    spread_b: float
    spread_a: float
    error: float
    consistency: float


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x**2))) if x.size else float("nan")


def _stats(name: str, sel: np.ndarray, cols: dict[str, np.ndarray]) -> TypeStats:
    """The statistics of the observations ``sel`` (mask) from the columns of
    :func:`type_statistics` (``used`` the accepted mask)."""
    used = sel & cols["used"]
    omb, oma, error = cols["omb"][used], cols["oma"][used], cols["error"][used]
    spread_b, spread_a = cols["spread_b"][used], cols["spread_a"][used]
    n = int(used.sum())
    expected = float(np.mean(error**2 + spread_b**2)) if n else float("nan")
    return TypeStats(
        name=name,
        total=int(sel.sum()),
        count=n,
        omb=InnovationStats.from_sums(float(omb.sum()), float((omb**2).sum()), n),
        oma=InnovationStats.from_sums(float(oma.sum()), float((oma**2).sum()), n),
        spread_b=_rms(spread_b),
        spread_a=_rms(spread_a),
        error=_rms(error),
        consistency=float(np.mean(omb**2)) / expected if n and expected > 0 else float("nan"),
    )


def file_of(ids: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Pure: the observation file (0-based, config order) of each global id, shape (m,).

    Ids are numbered across the files in order (each file offset by the sizes
    of those before it, :func:`~ensio.analysis.inputs.load_observations`).
    """
    starts = np.cumsum([0, *sizes])[:-1]
    return (np.searchsorted(starts, np.asarray(ids), side="right") - 1).astype(np.int64)


def type_statistics(diag: ObsDiagnostics, names: Sequence[str],
                    files: Sequence[tuple[str, int]] = ()) -> list[TypeStats]:  # fmt: skip
    """Per observed variable (``names``: the layout's, in its order; only those observed),
    then, with more than one observation file (``files``: name and size of each, config
    order), per file (``file NAME``), then ``all`` over every observation.

    Per file because one variable is often observed by several networks (SST and
    profiles of temperature) whose errors and fits differ.
    """
    cols = {"used": diag.accepted, "omb": diag.omb, "oma": diag.oma, "error": diag.error,
            "spread_b": diag.spread_b, "spread_a": diag.spread_a}  # fmt: skip
    out = [_stats(name, diag.variable == k, cols)
           for k, name in enumerate(names) if np.any(diag.variable == k)]  # fmt: skip
    if len(files) > 1:
        which = file_of(diag.ids, [n for _, n in files])
        out += [_stats(f"file {name}", which == i, cols) for i, (name, _) in enumerate(files)]
    return out + [_stats("all", np.ones(len(diag), bool), cols)]


#: The per-type statistics as the file names them, in the order ``ensio report`` shows them.
TYPE_FIELDS = ("n_obs", "n_used", "omb_mean", "omb_rms", "oma_mean", "oma_rms",
               "spread_b_rms", "spread_a_rms", "error_rms", "consistency")  # fmt: skip


def _row(s: TypeStats) -> dict[str, Any]:
    """``type`` then :data:`TYPE_FIELDS`, in that order (the file's variable order)."""
    values = (s.total, s.count, s.omb.mean, s.omb.rms, s.oma.mean, s.oma.rms, s.spread_b,
              s.spread_a, s.error, s.consistency)  # fmt: skip
    return {"type": s.name, **dict(zip(TYPE_FIELDS, values, strict=True))}


class DiagTables(NamedTuple):
    """What the diagnostics file holds, as plain data (the io room may not import this one).

    ``columns``: per-observation file variable -> (m,) array; ``rows``: per type,
    ``type`` then :data:`TYPE_FIELDS` (the last row is ``all``); ``names``: the
    state variables ``obs_type`` indexes; ``qc_flags``: the meaning of each ``qc``;
    ``files``: the observation files ``obs_file`` indexes.
    """

    columns: dict[str, np.ndarray]
    rows: list[dict[str, Any]]
    names: tuple[str, ...]
    qc_flags: tuple[str, ...]
    files: tuple[str, ...]


def diagnostics_tables(diag: ObsDiagnostics, names: Sequence[str],
                       files: Sequence[tuple[str, int]]) -> DiagTables:  # fmt: skip
    """Pure: the diagnostics file's contents (:class:`DiagTables`); ``files``: the name
    and size of every observation file, config order."""
    columns = {
        "obs_id": diag.ids, "lon": diag.lon, "lat": diag.lat, "level": diag.level,
        "level_index": diag.level_index, "obs_type": diag.variable,
        "obs_file": file_of(diag.ids, [n for _, n in files]), "value": diag.value,
        "error": diag.error, "qc": diag.qc, "omb": diag.omb, "oma": diag.oma,
        "spread_b": diag.spread_b, "spread_a": diag.spread_a,
    }  # fmt: skip
    rows = [_row(s) for s in type_statistics(diag, names, files)]
    return DiagTables(columns, rows, tuple(names), QC_FLAGS, tuple(f for f, _ in files))


def gathered_tables(
    local: ObsDiagnostics | None, names: Sequence[str], files: Sequence[tuple[str, int]],
    comm: MPI.Comm,
) -> DiagTables | None:  # fmt: skip
    """Collective: :func:`diagnostics_tables` of every rank's observations, on rank 0
    (None elsewhere, and everywhere when ``local`` is None on rank 0)."""
    diag = gather_diagnostics(local if local is not None else _empty(), comm)
    return None if diag is None or local is None else diagnostics_tables(diag, names, files)

"""The offline analysis: read the members, assimilate, write the analysis back.

``ensio analyse CONFIG`` (under ``mpiexec -n N`` or alone) calls
:func:`run_analysis`. It composes the parallel ensemble I/O (``io``) and the
distributed analysis (``analysis``); neither knows the other.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mpi4py import MPI

from .analysis.distributed import (
    DistributedAssimilation,
    analyse_rows,
    localization_coords,
    observation_owners,
    observations_near,
)
from .analysis.filters import localization_from_config
from .config.schema import Config, ConfigError
from .errors import InputError
from .io.ensemble import EnsembleBlock, read_ensemble, write_ensemble
from .io.products import copy_members, write_field_file
from .layout.state import StateLayout
from .obs import ObsBatch, RegularGrid, build_operator, read_obs_netcdf
from .obs.read import PARTIAL_READ_BYTES, obs_count
from .parallel.agree import all_call, root_call
from .parallel.distribution import block_distribution

__all__ = ["AnalysisReport", "load_observations", "run_analysis", "state_grid"]


@dataclass
class AnalysisReport:
    """What one offline analysis did (the same on every rank)."""

    result: DistributedAssimilation
    seconds: dict[str, float] = field(default_factory=dict)
    n_obs_read: int = 0

    def lines(self) -> list[str]:
        """The log lines ``ensio analyse`` prints."""
        r = self.result
        qc = r.qc
        reasons = ", ".join(
            f"{k} {v}"
            for k, v in dataclasses.asdict(qc).items()
            if k not in ("total", "accepted") and isinstance(v, int) and v
        )
        out = [
            f"observations: {self.n_obs_read} read, {qc.accepted} accepted, "
            f"{qc.rejected} rejected" + (f" ({reasons})" if reasons else "")
        ]
        for name, s in (("prior", r.prior), ("posterior", r.posterior)):
            out.append(
                f"{name:9s} innovation: mean {s.mean:+.4g}  rms {s.rms:.4g}  "
                f"accepted {s.count}  rejected {qc.rejected}"
            )
        order = ("read", "obs", "analysis", "write", "products", "total")
        out.append(
            "timing: "
            + "  ".join(f"{k} {self.seconds[k]:.3f} s" for k in order if k in self.seconds)
        )
        return out


def load_observations(
    config: Config,
    comm: MPI.Comm,
    layout: StateLayout,
    start: int,
    count: int,
    row_lonlat: np.ndarray | None,
) -> ObsBatch:
    """Collective: the observations this rank needs, with global ids.

    Global filters need every observation on every rank. A local filter
    keeps only those within the support radius of its rows plus those it
    owns (for the global counts). Files up to ``PARTIAL_READ_BYTES`` are read
    once by rank 0 and broadcast; larger files are read by every rank, the
    locations in full and the values and errors of its selection only.
    Files after the first get ids offset by the sizes before them, so the
    EnKF perturbation streams are keyed by a global number.
    """
    if not config.observations:
        raise ConfigError("observations: at least one observation file is needed for an analysis")
    assert config.analysis is not None
    paths = [config.resolve(e.file) for e in config.observations]

    def sizes() -> list[tuple[int, int]]:
        out = []
        for p in paths:
            if not p.exists():
                raise InputError(f"{p}: observation file not found")
            out.append((obs_count(p), p.stat().st_size))
        return out

    info = root_call(comm, sizes)
    local = config.analysis.localization is not None
    grid = state_grid(layout)
    batches, offset = [], 0
    for path, (n, nbytes) in zip(paths, info, strict=True):
        if local and comm.size > 1 and nbytes > PARTIAL_READ_BYTES:
            where = all_call(comm, lambda p=path, o=offset: read_obs_netcdf(p, o, values=False))
            sel = _needed(where, config, comm, layout.n_rows, start, count, row_lonlat, grid)
            batch = all_call(comm, lambda p=path, o=offset, s=sel: read_obs_netcdf(p, o, select=s))
        else:
            batch = root_call(comm, lambda p=path, o=offset: read_obs_netcdf(p, o))
            if local and comm.size > 1:
                batch = batch.subset(
                    _needed(batch, config, comm, layout.n_rows, start, count, row_lonlat, grid)
                )
        batches.append(batch)
        offset += n
    return ObsBatch.concat(batches)


def _needed(obs, config, comm, n_rows, start, count, row_lonlat, grid) -> np.ndarray:
    """Positions (within ``obs``) of the observations this rank needs: near or owned."""
    op, inside = build_operator(obs, n_rows, grid)
    owners = observation_owners(op, inside, obs.ids, n_rows, comm.size)
    row_coords, obs_coords = localization_coords(config.analysis, start, count, row_lonlat, obs)
    geometry = localization_from_config(config.analysis.localization).geometry
    near = observations_near(
        geometry, row_coords, obs_coords, config.analysis.localization.support_radius
    )
    return np.flatnonzero(near | (owners == comm.rank))


def state_grid(layout: StateLayout) -> RegularGrid | None:
    """The regular lon/lat grid of the first state variable, for bilinear H (if it has one)."""
    lon, lat = layout.coords.get("lon"), layout.coords.get("lat")
    if lon is None or lat is None or len(lon[0]) != 1 or len(lat[0]) != 1:
        return None
    v = layout.variables[0]
    if v.active is not None or v.dims[-2:] != (lat[0][0], lon[0][0]) or len(v.dims) != 2:
        return None
    return RegularGrid(lon=lon[1], lat=lat[1], offset=v.offset)


def _row_lonlat(layout: StateLayout, start: int, count: int) -> np.ndarray | None:
    if "lon" not in layout.coords or "lat" not in layout.coords:
        return None
    c = layout.coordinates(start, start + count)
    return np.stack([c["lon"], c["lat"]], axis=1)


def assimilate_rows(
    config: Config,
    comm: MPI.Comm,
    layout: StateLayout,
    X: np.ndarray,
    start: int,
    cycle: int,
    seconds: dict[str, float],
) -> DistributedAssimilation:
    """Collective: load this rank's observations and analyse its rows ``X`` (k, count).

    Shared by the offline path and the online filter, so both run exactly the
    same analysis. Adds ``obs`` (reading, H, the HX exchange, QC) and
    ``analysis`` (the filter) to ``seconds``.
    """
    assert config.analysis is not None
    count = X.shape[1]
    t = time.perf_counter()
    row_lonlat = _row_lonlat(layout, start, count)
    obs = load_observations(config, comm, layout, start, count, row_lonlat)
    t_load = time.perf_counter() - t
    timings: dict[str, float] = {}
    t = time.perf_counter()
    result = analyse_rows(
        X,
        start,
        layout.n_rows,
        row_lonlat,
        obs,
        config.analysis,
        comm,
        grid=state_grid(layout),
        cycle=cycle,
        timings=timings,
    )
    seconds["obs"] = t_load + timings.get("obs", 0.0)
    seconds["analysis"] = time.perf_counter() - t - timings.get("obs", 0.0)
    return result


def run_analysis(config: Config, comm: MPI.Comm, *, cycle: int = 0) -> AnalysisReport:
    """Collective: the whole offline analysis of one cycle.

    Reads the members (N_io I/O tasks), reads the observations, analyses
    every rank's rows, writes the analysis in place (journaled) or into
    copies at ``output.members``, and writes ``output.mean`` / ``output.spread``.
    """
    if config.analysis is None:
        raise ConfigError("analysis: section required (at least analysis.filter)")
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    block = read_ensemble(config, comm)
    seconds["read"] = time.perf_counter() - t0
    layout = block.layout
    result = assimilate_rows(config, comm, layout, block.data, block.start, cycle, seconds)
    t = time.perf_counter()
    analysis = EnsembleBlock(layout, block.start, block.count, result.ensemble)
    _write_members(config, comm, analysis)
    seconds["write"] = time.perf_counter() - t
    t = time.perf_counter()
    _write_products(config, comm, analysis)
    seconds["products"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    seconds = {k: float(comm.allreduce(v, op=MPI.MAX)) for k, v in seconds.items()}
    return AnalysisReport(result=result, seconds=seconds, n_obs_read=result.qc.total)


def _write_members(config: Config, comm: MPI.Comm, analysis: EnsembleBlock) -> None:
    if config.io.in_place:
        write_ensemble(config, comm, analysis)
        return
    # Copies: complete copies under temporary names, written, then renamed, so
    # that an interrupted run never leaves a file that looks finished. The
    # originals are not touched, so no journal is needed.
    assert config.output.members is not None
    pattern = Path(config.output.members)
    partial = str(pattern.parent / f".{pattern.name}.ensio-partial")
    out_cfg = dataclasses.replace(
        config,
        ensemble=dataclasses.replace(config.ensemble, members=partial),
        io=dataclasses.replace(config.io, journal=False),
    )
    finals, temps = config.output_member_paths(), out_cfg.member_paths()
    copy_members(config.member_paths(), temps, comm.rank, comm.size)
    comm.Barrier()
    write_ensemble(out_cfg, comm, analysis)
    for m in range(comm.rank, len(finals), comm.size):
        os.replace(temps[m], finals[m])
    comm.Barrier()


def _gather_rows(comm: MPI.Comm, n_rows: int, rows: np.ndarray) -> np.ndarray | None:
    counts = np.array([block_distribution(n_rows, comm.size, r)[1] for r in range(comm.size)])
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    full = np.empty(n_rows) if comm.rank == 0 else None
    comm.Gatherv(
        np.ascontiguousarray(rows), [full, counts, displs, MPI.DOUBLE] if full is not None else None
    )
    return full


def _write_products(config: Config, comm: MPI.Comm, analysis: EnsembleBlock) -> None:
    out = config.output
    X = analysis.data
    n = analysis.layout.n_rows
    fields = []
    if out.mean is not None:
        fields.append((out.mean, X.mean(axis=0), "analysis ensemble mean"))
    if out.spread is not None:
        ddof = 1 if X.shape[0] > 1 else 0
        fields.append((out.spread, X.std(axis=0, ddof=ddof), "analysis ensemble spread (std)"))
    template = config.output_member_paths()[0]
    for name, rows, what in fields:
        full = _gather_rows(comm, n, rows)
        root_call(
            comm,
            lambda name=name, full=full, what=what: write_field_file(
                config.resolve(name),
                template,
                analysis.layout,
                full,
                config.ensemble.coordinates,
                f"ensio analyse: {what}",
            ),
        )

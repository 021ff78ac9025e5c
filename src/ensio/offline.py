"""The offline analysis: read the members, assimilate, write the analysis back.

``ensio analyse CONFIG`` (under ``mpiexec -n N`` or alone) calls
:func:`run_analysis`. It composes the parallel ensemble I/O (``io``) and the
distributed analysis (``analysis``); neither knows the other. The analysis
step (:func:`ensio.analysis.inputs.assimilate_block`) and the writers of the
analysis members and products (:mod:`ensio.io.products`) are shared with the
filter side of the online mode, so both modes produce the same files.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from mpi4py import MPI

from .analysis.inputs import assimilate_block
from .analysis.result import AnalysisResult
from .config.schema import Config, ConfigError
from .io.ensemble import EnsembleIO, IOStats, open_ensemble
from .io.products import product_paths, write_member_copies, write_products
from .layout.block import EnsembleBlock

__all__ = ["AnalysisReport", "run_analysis"]


@dataclass
class AnalysisReport:
    """What one offline analysis did (the same on every rank)."""

    result: AnalysisResult
    seconds: dict[str, float] = field(default_factory=dict)
    n_obs_read: int = 0
    #: Per state variable: points left out because a member holds a missing value.
    inactive: dict[str, int] = field(default_factory=dict)
    #: Per state variable: analysis values clipped to the packed type / valid range.
    clipped: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The log lines ``ensio analyse`` prints."""
        r = self.result
        qc = r.qc
        assert qc is not None and r.prior is not None and r.posterior is not None
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
        for label, counts, what in (
            ("missing data", self.inactive, "inactive points (not analysed, bytes kept)"),
            ("packing", self.clipped, "analysis values clipped"),
        ):
            if any(counts.values()):
                per = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
                out.append(f"{label}: {sum(counts.values())} {what} ({per})")
        order = ("read", "obs", "analysis", "write", "products", "total")
        out.append(
            "timing: "
            + "  ".join(f"{k} {self.seconds[k]:.3f} s" for k in order if k in self.seconds)
        )
        return out


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
    obs_files = [config.resolve(e.file) for e in config.observations]
    # Built once for the read and the write of this analysis; freed on any error.
    with open_ensemble(config.member_paths(), config.ensemble, config.io, comm) as ens:
        block = ens.read()
        inactive = ens.stats.inactive if ens.stats is not None else {}
        seconds["read"] = time.perf_counter() - t0
        layout = block.layout
        result = assimilate_block(
            block, obs_files, config.analysis, comm, cycle=cycle, seconds=seconds
        )
        t = time.perf_counter()
        analysis = EnsembleBlock(layout, block.start, block.count, result.ensemble)
        written = _write_members(config, comm, ens, analysis)
    seconds["write"] = time.perf_counter() - t
    t = time.perf_counter()
    template = config.output_member_paths()[0]
    write_products(
        comm, layout, analysis.data, template, "ensio analyse",
        product_paths(config.output, config.base_dir), config.ensemble.coordinates,
    )  # fmt: skip
    seconds["products"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    seconds = {k: float(comm.allreduce(v, op=MPI.MAX)) for k, v in seconds.items()}
    assert result.qc is not None
    return AnalysisReport(
        result=result,
        seconds=seconds,
        n_obs_read=result.qc.total,
        inactive=inactive,
        clipped=written.clipped if written is not None else {},
    )


def _write_members(
    config: Config, comm: MPI.Comm, ens: EnsembleIO, analysis: EnsembleBlock
) -> IOStats | None:
    """Collective: the analysis in place (journaled, through ``ens``) or as copies."""
    if config.io.in_place:
        return ens.write(analysis)
    paths = config.output_member_paths()
    return write_member_copies(config.io, comm, analysis, config.member_paths(), paths)

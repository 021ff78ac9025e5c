"""What one offline analysis reports, whatever its I/O mode: :class:`AnalysisReport`.

Its own module so that the driver (:mod:`ensio.offline`) stays about the run
and every mode's run, whatever its hooks, ends in the same report.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpi4py import MPI

from .analysis.result import AnalysisResult
from .config.schema import Config
from .io.node.backup import BackupHandle, ensure_cycle_backup

__all__ = ["AnalysisReport", "already_report"]


@dataclass
class AnalysisReport:
    """What one offline analysis did (the same on every rank).

    ``already`` is the run record's entry when the members already held this
    analysis and nothing was done (``result`` is then None).
    """

    result: AnalysisResult | None
    seconds: dict[str, float] = field(default_factory=dict)
    n_obs_read: int = 0
    already: dict[str, Any] | None = None
    took_over: str | None = None  # the dead run whose stale lock this run took over
    #: Per state variable: points left out because a member holds a missing value.
    inactive: dict[str, int] = field(default_factory=dict)
    #: Per state variable: analysis values clipped to the packed type / valid range.
    clipped: dict[str, int] = field(default_factory=dict)
    #: A 4-D analysis: the posterior is H of the analysis at the analysis time,
    #: compared with observations taken at other times, so it is labelled so.
    four_d: bool = False
    #: The background copy to ``io.backup_dir`` (started when it is set; ``wait()`` joins it).
    backup: BackupHandle | None = None
    #: The observation-space diagnostics file written (``output.diagnostics``), if any.
    diagnostics: Path | None = None

    def _backup_lines(self) -> list[str]:
        if self.backup is None:
            return []
        return [f"backup: copying cycle {self.backup.cycle} to {self.backup.backup_dir} "
                "in the background (COMPLETE there when every file is durable)"]

    def lines(self) -> list[str]:
        """The log lines ``ensio analyse`` prints."""
        if self.already is not None:
            e = self.already
            return [f"already analysed: the members hold this analysis (cycle {e.get('cycle')}, "
                    f"committed {e.get('committed')}); nothing done (--force assimilates again)"
                    + e.get("note", "")] + self._backup_lines()
        r = self.result
        assert r is not None
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
            when = " (analysis time)" if self.four_d and name == "posterior" else ""
            out.append(
                f"{name:9s} innovation{when}: mean {s.mean:+.4g}  rms {s.rms:.4g}  "
                f"accepted {s.count}  rejected {qc.rejected}"
            )
        for label, counts, what in (
            ("missing data", self.inactive, "inactive points (not analysed, bytes kept)"),
            ("packing", self.clipped, "analysis values clipped"),
        ):
            if any(counts.values()):
                per = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
                out.append(f"{label}: {sum(counts.values())} {what} ({per})")
        if self.diagnostics is not None:
            out.append(f"diagnostics: {self.diagnostics} (O-B, O-A, spread, QC per observation)")
        out += self._backup_lines()
        order = ("read", "obs", "analysis", "write", "products", "record", "total")
        out.append(
            "timing: "
            + "  ".join(f"{k} {self.seconds[k]:.3f} s" for k in order if k in self.seconds)
        )
        return out


def already_report(config: Config, comm: MPI.Comm, cycle: int, done: dict[str, Any],
                   took_over: str | None) -> AnalysisReport:  # fmt: skip
    """Collective: the report of a run the record shows done; a backup that failed or
    was killed is made now (the files hold the analysis, the backup may not)."""
    backup = ensure_cycle_backup(config, comm, cycle) if config.io.backup_dir else None
    return AnalysisReport(result=None, already=done, took_over=took_over, backup=backup)

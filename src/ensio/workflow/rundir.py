"""The run directory of ``ensio cycle``, in one place for both modes.

::

    DIR/cycle_CCC/analysis.yaml            the analysis config of the cycle
    DIR/cycle_CCC/forecast/memMMM.nc       member forecasts
    DIR/cycle_CCC/analysis/memMMM.nc       analysis members (+ mean.nc, spread.nc)
    DIR/cycle_CCC/diag.nc                  observation-space diagnostics (O-B, O-A, ...)
    DIR/cycle_CCC/.done                    the cycle is complete

The offline driver (:mod:`ensio.workflow.cycle`), the online driver
(:mod:`ensio.workflow.online`) and coupled programs
(:mod:`ensio.online.cycling`) all read and write this layout, so a run can be
resumed, reported on and even switch modes between cycles; spelling it once
keeps them from drifting apart. No imports beyond the standard library, so
the coupled side can use it without the pool.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "MEMBER_FILE",
    "analysis_config_path",
    "analysis_pattern",
    "cycle_dir",
    "diagnostics_path",
    "done_marker",
    "forecast_pattern",
    "restart_pattern",
]

#: File name pattern of a member in ``forecast/`` and ``analysis/``.
MEMBER_FILE = "mem{member:03d}.nc"


def cycle_dir(workdir: Path, cycle: int) -> Path:
    """``DIR/cycle_CCC``."""
    return Path(workdir) / f"cycle_{cycle:03d}"


def forecast_pattern(workdir: Path, cycle: int) -> str:
    """``DIR/cycle_CCC/forecast/mem{member:03d}.nc``."""
    return str(cycle_dir(workdir, cycle) / "forecast" / MEMBER_FILE)


def analysis_pattern(workdir: Path, cycle: int) -> str:
    """``DIR/cycle_CCC/analysis/mem{member:03d}.nc``."""
    return str(cycle_dir(workdir, cycle) / "analysis" / MEMBER_FILE)


def restart_pattern(workdir: Path, cycle: int, initial: str) -> str:
    """The restarts ``cycle`` starts from: ``initial`` (relative to DIR) for cycle 1,
    else the previous cycle's analysis members."""
    if cycle == 1:
        return initial if Path(initial).is_absolute() else str(Path(workdir) / initial)
    return analysis_pattern(workdir, cycle - 1)


def diagnostics_path(workdir: Path, cycle: int) -> Path:
    """``DIR/cycle_CCC/diag.nc``, the cycle's observation-space diagnostics
    (``output.diagnostics`` of its analysis; ``ensio report`` reads them)."""
    return cycle_dir(workdir, cycle) / "diag.nc"


def analysis_config_path(workdir: Path, cycle: int) -> Path:
    """``DIR/cycle_CCC/analysis.yaml``, the ``ensio analyse`` config of the cycle."""
    return cycle_dir(workdir, cycle) / "analysis.yaml"


def done_marker(workdir: Path, cycle: int) -> Path:
    """``DIR/cycle_CCC/.done``, written once every analysis file of the cycle exists."""
    return cycle_dir(workdir, cycle) / ".done"
